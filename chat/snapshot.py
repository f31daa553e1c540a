"""What a (re)connecting client gets first: the saved state plus the live tail from Redis.

Callers join the conversation's group BEFORE taking the snapshot; then every delta is either
in the snapshot (seq <= the part's snapshot seq) or arrives live afterwards, so dropping live
deltas at or below the snapshot seq gives no gap and no duplicate.
"""

from __future__ import annotations

from chat import branches, live_text
from chat.events import part_payload
from chat.models import Message, Part
from chat.states import message_status


def part_with_tail(part: Part) -> dict:
    """A part's payload whose text includes deltas not yet saved to the database."""
    payload = part_payload(part)
    if part.kind == Part.Kind.TEXT and part.state in (Part.State.STREAMING, Part.State.QUEUED):
        payload["text"], payload["seq"] = live_text.streamed(part)
    return payload


def message_payload(message: Message, place: tuple[int, int] | None = None) -> dict:
    """A message as the page draws it: the version on screen, and which branch it is (of
    its edits: `branch` / `branches`); `place` saves looking that up."""
    parts = message.shown_parts()
    branch, count = place or branches.place(message)
    return {
        "id": message.pk,
        "branch": branch,
        "branches": count,
        "version": message.shown_version,
        "versions": message.version_count(),
        "role": message.role,
        "position": message.position,
        "text": message.text,
        "wants_image": message.wants_image,
        "history_truncated": message.history_truncated,
        "status": message_status([p.state for p in parts]) if parts else None,
        "parts": [part_with_tail(p) for p in parts],
    }


def conversation_snapshot(conversation_id: int) -> list[dict]:
    """The messages of the branch on screen, oldest first, with live text."""
    messages = branches.tree(conversation_id)
    places = branches.places(messages)
    return [message_payload(m, places[m.pk]) for m in branches.shown_path(messages)]
