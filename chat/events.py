"""Live events for the browser, published on a conversation's Redis pub/sub channel.

Every web process and Celery worker can reach every browser this way: one PUBLISH per event,
whatever the number of readers; each web process subscribes once per conversation and hands
the event to its own sockets and streams (`chat.fanout`). The event travels as the JSON the
browser gets, so a process encodes nothing per reader. Three event types:
`part.delta` (text pieces `first`..`seq` of a part, joined), `part.state` (state, progress,
error, image URL, text for final states) and `message.state` (the derived status); the
conversation's own events (`conversation.state`, `conversation.deleted`) are built in
`chat/conversations.py`, above this layer.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from redis.client import Pipeline
from redis.exceptions import RedisError

from chat.models import Part
from chat.states import message_status
from config.redis_client import redis_client

log = logging.getLogger(__name__)


def channel_name(conversation_id: int, database: int | None = None) -> str:
    """The pub/sub channel of one conversation's live events.

    Pub/sub channels are not per Redis database, so the name carries the database number
    (REDIS_URL's unless given): processes on other databases (another test run, another
    deployment) never hear it.
    """
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    if database is None:
        database = redis_client().connection_pool.connection_kwargs.get("db", 0)
    return f"{prefix}:live:{database}:conversation.{conversation_id}"


def encode(event: dict) -> str:
    """The event as the browser's WebSocket receives it."""
    return json.dumps(event, separators=(",", ":"))


def part_payload(part: Part) -> dict:
    """What a browser needs to draw a part (the same shape the page renders from)."""
    return {
        "id": part.pk,
        "message_id": part.message_id,
        "version": part.version,
        "index": part.index,
        "kind": part.kind,
        "state": part.state,
        "seq": part.seq,
        "text": part.text,
        "progress": round(part.progress, 3),
        "error": part.error,
        "attempt": part.attempt,
        "image_url": part.image.url if part.image else None,
        "previous_image_url": part.previous_image.url if part.previous_image else None,
        "finish_reason": part.finish_reason,
    }


def send(conversation_id: int, event: dict) -> bool:
    """Send from synchronous code (services, Celery tasks, the stream writer thread).

    A broker outage must not break the caller: the state is already saved, and a browser
    that missed the event gets it from the saved state when it reconnects. False when the
    event was not sent.
    """
    try:
        redis_client().publish(channel_name(conversation_id), encode(event))
    except (RedisError, OSError):
        log.warning(
            "could not send %s to conversation %s",
            event.get("type"),
            conversation_id,
            exc_info=True,
        )
        return False
    return True


def send_in(pipe: Pipeline, conversation_id: int, event: dict) -> None:
    """Queue the event's PUBLISH on `pipe`: the text writer sends many parts' deltas in one
    round trip and handles the pipeline's errors itself."""
    pipe.publish(channel_name(conversation_id), encode(event))


def part_state_event(part: Part) -> dict:
    return {"type": "part.state", "part": part_payload(part)}


def message_state_event(message_id: int, states: list[str]) -> dict:
    return {"type": "message.state", "message_id": message_id, "status": message_status(states)}


def delta_event(
    part_id: int,
    message_id: int,
    seq: int,
    text: str,
    emitted: float | None = None,
    first: int | None = None,
) -> dict:
    """Text pieces `first`..`seq` of a part, joined (one piece when `first` is not given).

    `t` is when the engine emitted the first of them (time.time()), for bench/stream.py.
    """
    event = {
        "type": "part.delta",
        "part_id": part_id,
        "message_id": message_id,
        "first": seq if first is None else first,
        "seq": seq,
        "text": text,
    }
    if emitted is not None:
        event["t"] = emitted
    return event
