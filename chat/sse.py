"""GET /messages/<id>/events: the same live events as the WebSocket, for one message, as SSE.

Each text delta carries `id: <seq>`; a client reconnecting with Last-Event-ID gets the pieces
after it from the live tail, then live events, with none lost or repeated (`chat.resume`).
"""

from __future__ import annotations

import asyncio
import json

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.http import Http404, HttpRequest, HttpResponse

from chat.events import group_name
from chat.models import Message
from chat.resume import Resume, catch_up
from chat.snapshot import message_payload
from inference.api.sse import sse_response

KEEPALIVE = 15.0


def frame(event: str, data: dict, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def event_frame(event: dict) -> bytes:
    """A channel-layer event as SSE: its type names the event, a delta's seq is its id."""
    data = {key: value for key, value in event.items() if key != "type"}
    if event["type"] == "part.delta":
        return frame("part.delta", data, event["seq"])
    if event["type"] == "part.state":
        return frame("part.state", event["part"])
    return frame(event["type"], data)


@sync_to_async
def load(user, message_id: int) -> dict:
    message = (
        Message.objects.filter(pk=message_id, conversation__owner=user, role="assistant")
        .prefetch_related("parts")
        .first()
    )
    if message is None:
        raise Http404("No such message.")
    return {"conversation_id": message.conversation_id, "payload": message_payload(message)}


def last_event_id(request: HttpRequest) -> int | None:
    raw = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


async def events(request: HttpRequest, message_id: int) -> HttpResponse:
    user = await request.auser()
    if not user.is_authenticated:
        return HttpResponse(status=401)
    found = await load(user, message_id)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    group = group_name(found["conversation_id"])
    await layer.group_add(group, channel)
    # Snapshot after joining: see chat/resume.py for why this order gives no gap.
    found = await load(user, message_id)
    resume_from = last_event_id(request)

    async def stream():
        try:
            parts = found["payload"]["parts"]
            resume = Resume(parts, message_id=message_id)
            for part in parts:
                if resume_from is not None:
                    deltas, part = await sync_to_async(catch_up)(part, resume_from)
                    for delta in deltas:
                        yield event_frame(delta)
                yield frame("part.state", part)
            yield frame(
                "message.state", {"message_id": message_id, "status": found["payload"]["status"]}
            )
            if found["payload"]["status"] != "in_progress":
                return
            while True:
                try:
                    event = await asyncio.wait_for(layer.receive(channel), KEEPALIVE)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                if not resume.admit(event):
                    continue
                yield event_frame(event)
                if event["type"] == "message.state" and event["status"] != "in_progress":
                    return
        finally:
            await layer.group_discard(group, channel)

    return sse_response(stream())
