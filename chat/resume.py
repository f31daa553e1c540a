"""The resume protocol of both live transports, the WebSocket consumer and SSE.

A client joins the conversation's group first, then takes the snapshot (the saved state plus
the live tail, `chat.snapshot`): every delta is then either in the snapshot or arrives live
afterwards. `Resume` remembers, per part, the highest seq the client has been shown and drops
live deltas at or below it, so a (re)connect neither loses nor repeats text. A client that
says which deltas it already has (SSE's Last-Event-ID) gets only the later ones: `catch_up`.
"""

from __future__ import annotations

from collections.abc import Iterable

from chat import events, live_text
from chat.models import Part


def event_message_id(event: dict) -> int | None:
    """The message a live event is about (None for events that are about none)."""
    if event["type"] == "part.state":
        return event["part"]["message_id"]
    if event["type"] == "message.update":
        return event["message"]["id"]
    return event.get("message_id")


class Resume:
    """What one connection has shown of each part; decides which live events it still sends."""

    def __init__(self, parts: Iterable[dict], message_id: int | None = None) -> None:
        """`parts` are the snapshot's payloads; `message_id` limits the events to one message."""
        self.seen: dict[int, int] = {part["id"]: part["seq"] for part in parts}
        self.message_id = message_id

    def admit(self, event: dict) -> bool:
        """Whether a live event goes to the client; what it lets through counts as seen.

        A delta at or below its part's seen seq is already on screen. A part state carries the
        text up to its own seq, so deltas up to that seq are dropped after it too.
        """
        if self.message_id is not None and event_message_id(event) != self.message_id:
            return False
        if event["type"] == "part.delta":
            if event["seq"] <= self.seen.get(event["part_id"], 0):
                return False
            self.seen[event["part_id"]] = event["seq"]
        elif event["type"] == "part.state":
            self.show(event["part"])
        elif event["type"] == "message.update":  # another version: all its parts, as saved
            for part in event["message"]["parts"]:
                self.show(part)
        elif event["type"] == "conversation.branch":  # another branch: all of it, as saved
            for message in event["messages"]:
                for part in message["parts"]:
                    self.show(part)
        return True

    def show(self, part: dict) -> None:
        """The client was given this part's text up to its seq."""
        self.seen[part["id"]] = max(self.seen.get(part["id"], 0), part["seq"])


def catch_up(part: dict, after_seq: int) -> tuple[list[dict], dict]:
    """For a client holding a part's deltas up to `after_seq`: the delta events after it from
    the live tail, and the part's snapshot payload, without its text when the client has it.
    """
    if part["kind"] != Part.Kind.TEXT:
        return [], part
    pieces = live_text.tail(part["id"], after_seq)
    deltas = [
        events.delta_event(part["id"], part["message_id"], seq, text)
        for seq, text in enumerate(pieces, start=after_seq + 1)
    ]
    if pieces or part["seq"] <= after_seq:
        part = {**part, "text": None}  # the client already has it
    return deltas, part
