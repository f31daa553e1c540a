"""Live events for the browser, sent through the Redis channel layer to a conversation's group.

Every web process and Celery worker can reach every browser this way. Three event types:
`part.delta` (a text piece and its per-part sequence number), `part.state` (state, progress,
error, image URL, text for final states) and `message.state` (the derived status); the
conversation's own events (`conversation.state`, `conversation.deleted`) are built in
`chat/conversations.py`, above this layer.
"""

from __future__ import annotations

import logging

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from redis.exceptions import RedisError

from chat import layer_sender
from chat.models import Part
from chat.states import message_status

log = logging.getLogger(__name__)


def group_name(conversation_id: int) -> str:
    """The channel-layer group of one conversation's sockets and streams."""
    return f"conversation.{conversation_id}"


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
        layer_sender.run(get_channel_layer().group_send(group_name(conversation_id), event))
    except (RedisError, OSError, ChannelFull):  # a time limit or a bug still propagates
        log.warning(
            "could not send %s to conversation %s",
            event.get("type"),
            conversation_id,
            exc_info=True,
        )
        return False
    return True


def part_state_event(part: Part) -> dict:
    return {"type": "part.state", "part": part_payload(part)}


def message_state_event(message_id: int, states: list[str]) -> dict:
    return {"type": "message.state", "message_id": message_id, "status": message_status(states)}


def delta_event(
    part_id: int, message_id: int, seq: int, text: str, emitted: float | None = None
) -> dict:
    """A text piece; `t` is when the engine emitted it (time.time()), for bench/stream.py."""
    event = {
        "type": "part.delta",
        "part_id": part_id,
        "message_id": message_id,
        "seq": seq,
        "text": text,
    }
    if emitted is not None:
        event["t"] = emitted
    return event
