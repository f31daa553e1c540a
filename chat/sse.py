"""GET /messages/<id>/events: the same live events as the WebSocket, for one message, as SSE.

Each text delta carries `id: <seq>`; a client reconnecting with Last-Event-ID gets the pieces
after it from the live tail, then live events, with none lost or repeated.
"""

from __future__ import annotations

import asyncio
import json

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse

from chat import live_text
from chat.events import group_name
from chat.models import Message, Part
from chat.snapshot import message_payload

KEEPALIVE = 15.0


def frame(event: str, data: dict, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


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
    # Snapshot after joining: see chat/snapshot.py for why this order gives no gap.
    found = await load(user, message_id)
    resume_from = last_event_id(request)

    async def stream():
        try:
            seen: dict[int, int] = {}
            for part in found["payload"]["parts"]:
                if part["kind"] == Part.Kind.TEXT and resume_from is not None:
                    pieces = await sync_to_async(live_text.tail)(part["id"], resume_from)
                    for offset, text in enumerate(pieces, start=resume_from + 1):
                        data = {
                            "part_id": part["id"],
                            "message_id": message_id,
                            "seq": offset,
                            "text": text,
                        }
                        yield frame("part.delta", data, offset)
                    if pieces or part["seq"] <= resume_from:
                        part = {**part, "text": None}  # the client already has it
                seen[part["id"]] = part["seq"]
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
                event = dict(event)  # channels-redis hands one dict to every local receiver
                kind = event.pop("type")
                if kind == "part.delta" and event["message_id"] == message_id:
                    if event["seq"] > seen.get(event["part_id"], 0):
                        seen[event["part_id"]] = event["seq"]
                        yield frame(kind, event, event["seq"])
                elif kind == "part.state" and event["part"]["message_id"] == message_id:
                    yield frame(kind, event["part"])
                elif kind == "message.state" and event["message_id"] == message_id:
                    yield frame(kind, event)
                    if event["status"] != "in_progress":
                        return
        finally:
            await layer.group_discard(group, channel)

    response = StreamingHttpResponse(stream(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
