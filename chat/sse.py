"""GET /messages/<id>/events: the same live events as the WebSocket, for one message, as SSE.

Each text delta carries `id: <seq>` (the last seq of its range); a client reconnecting with
Last-Event-ID gets the pieces after it from the live tail, then live events, with none lost or
repeated (`chat.resume`). When the stream is dropped to resume (`chat.fanout`) it ends, and
the client's EventSource reconnects with its Last-Event-ID.

An async view that holds no thread while it streams. Django's handler gives each request a
one-thread executor for its thread-sensitive calls (every MiddlewareMixin middleware makes
them), kept until the response ends: for a stream, one idle OS thread per reader (measured in
docs/benchmarks.md). The view does its own database work on the readers' thread, which
keeps its connection (`chat.kept_connections`), and the stream lets the request's executor
go as it starts, once the middleware is done with it. Events come from the process's
subscription (`chat.fanout`) and are framed once per process; under Daphne the frame of a
plain live event is written to the stream's connection as it is delivered (`chat.direct`),
while everything that needs the stream's own task (the opening frames, a mended delta, the
message's end, keepalives) goes through Django's response as before.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import weakref
from collections.abc import AsyncIterator

import redis
from asgiref.sync import SyncToAsync
from django.contrib.auth import get_user
from django.http import Http404, HttpRequest, HttpResponse

from chat import direct, fanout
from chat.kept_connections import readers
from chat.models import Message, Part
from chat.resume import Resume, catch_up, live, send_now
from chat.snapshot import message_payload
from inference.api.sse import sse_response

KEEPALIVE = 15.0
SHED_KEEPS = frozenset({"scope", "path", "path_info", "script_name", "method"})
log = logging.getLogger(__name__)


def frame(event: str, data: dict, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def event_frame(event: dict) -> bytes:
    """A live event as SSE: its type names the event, a delta's last seq is its id."""
    data = {key: value for key, value in event.items() if key != "type"}
    if event["type"] == "part.delta":
        return frame("part.delta", data, event["seq"])
    if event["type"] == "part.state":
        return frame("part.state", event["part"])
    return frame(event["type"], data)


def delivery_frame(delivery: fanout.Delivery) -> bytes:
    return event_frame(delivery.event)


def own_reply(user, message_id: int):
    """The user's assistant message `message_id`, as a query (empty when it is not theirs)."""
    return Message.objects.filter(pk=message_id, conversation__owner=user, role="assistant")


@readers.make_async
def reader_of(request: HttpRequest, message_id: int) -> tuple[object, int | None]:
    """The signed-in user and the conversation of their reply `message_id` (None when there is
    no such reply of theirs), in one trip to the executor and without building the message."""
    user = get_user(request)
    if not user.is_authenticated:
        return user, None
    conversations = own_reply(user, message_id).values_list("conversation_id", flat=True)
    return user, conversations.first()


@readers.make_async
def load(user, message_id: int) -> dict:
    message = own_reply(user, message_id).prefetch_related("parts").first()
    if message is None:
        raise Http404("No such message.")
    return message_payload(message)


def release_request_thread() -> None:
    """Shut down the request's one-thread executor (asgiref's `ThreadSensitiveContext`); a
    later thread-sensitive call of this request (the response's close) gets a new one, which
    the handler shuts down at the end as usual."""
    context = SyncToAsync.thread_sensitive_context.get(None)
    if context is None:  # not under Django's handler: no executor of the request's own
        return
    executor = SyncToAsync.context_to_thread_executor.pop(context, None)
    if executor is not None:
        executor.shutdown(wait=False)


def shed(request: HttpRequest) -> None:
    """Let go of what the middleware and the view are done with (the session, the user, the
    messages storage, the resolver match, cookies, META, parsed headers and query): Django's
    handler holds the request for as long as its stream lasts, one per reader. What stays
    names the request (its scope, path and method)."""
    for name in [name for name in vars(request) if name not in SHED_KEEPS]:
        delattr(request, name)


def last_event_id(request: HttpRequest) -> int | None:
    raw = request.META.get("HTTP_LAST_EVENT_ID") or request.GET.get("last_event_id")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


async def events(request: HttpRequest, message_id: int) -> HttpResponse:
    user, conversation_id = await reader_of(request, message_id)
    if not user.is_authenticated:
        return HttpResponse(status=401)
    if conversation_id is None:
        raise Http404("No such message.")
    try:
        reader = await fanout.hub().join(conversation_id)
    except (redis.RedisError, OSError, TimeoutError):
        return HttpResponse("Live events are unavailable; try again.", status=503)
    try:
        # Snapshot after joining: see chat/resume.py for why this order gives no gap.
        payload = await load(user, message_id)
    except BaseException:
        reader.close()
        raise
    events_of = stream(request, reader, payload, message_id)
    # A client gone before Django iterates the stream leaves a generator that never starts,
    # so its `finally` never runs: the reader goes with the generator instead.
    weakref.finalize(events_of, close_on, asyncio.get_running_loop(), reader).atexit = False
    return sse_response(events_of)


def close_on(loop: asyncio.AbstractEventLoop, reader: fanout.Reader) -> None:
    """Close `reader` on its event loop, from whatever thread drops the last reference to its
    stream; a no-op for a reader its stream already closed."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(reader.close)


async def opening(
    payload: dict, message_id: int, resume_from: int | None, resume: Resume
) -> AsyncIterator[bytes]:
    """The snapshot's frames; on a reconnect, each part's pieces after `resume_from` first.

    What the client then holds of a text part (up to `resume_from`, and the pieces sent
    after it) goes into `resume`: the snapshot's own seq can lag behind it (a delta is
    published before the live tail holds it), and live deltas from that seq on would repeat
    what the client has."""
    for part in payload["parts"]:
        if resume_from is not None:
            deltas, part = await readers.run(catch_up, part, resume_from)
            for delta in deltas:
                yield event_frame(delta)
            if part["kind"] == Part.Kind.TEXT:
                resume.holds(part["id"], deltas[-1]["seq"] if deltas else resume_from)
        yield frame("part.state", part)
    yield frame("message.state", {"message_id": message_id, "status": payload["status"]})


async def stream(
    request: HttpRequest, reader: fanout.Reader, payload: dict, message_id: int
) -> AsyncIterator[bytes]:
    """The opening frames (the snapshot, or what follows Last-Event-ID), then live events.

    It keeps neither the snapshot nor the request's session, user and the like while it
    waits for events: at a thousand readers per process, what each stream holds is what
    the process's memory grows by (docs/benchmarks.md).
    """
    # The middleware is done with the request: the stream needs no thread, nor its state.
    release_request_thread()
    resume_from = last_event_id(request)
    writer = request.scope.get("extensions", {}).get(direct.EXTENSION)
    shed(request)
    del request
    try:
        resume = Resume(payload["parts"], message_id=message_id)
        status = payload["status"]
        async for opened in opening(payload, message_id, resume_from, resume):
            yield opened
        del payload
        if status != "in_progress":
            return
        # Past here the frames above have gone out: direct writes come after them.
        if writer is not None:
            reader.direct = functools.partial(
                send_now, writer, resume, keep="message.state", name="sse", frame=delivery_frame
            )
        async for event, delivery in live(reader, resume, idle=KEEPALIVE):
            if event is None:
                yield b": keepalive\n\n"
                continue
            if delivery is None:
                yield event_frame(event)
            else:
                yield delivery.encoded("sse", delivery_frame)
            if event["type"] == "message.state" and event["status"] != "in_progress":
                return
        # Dropped to resume: the stream ends and the client reconnects with Last-Event-ID.
        log.info("sse stream of message %s resumes: %s", message_id, reader.lost)
    finally:
        reader.close()
