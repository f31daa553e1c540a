"""The resume protocol of both live transports, the WebSocket consumer and SSE.

A client joins the conversation's group first, then takes the snapshot (the saved state plus
the live tail, `chat.snapshot`): every delta is then either in the snapshot or arrives live
afterwards. `Resume` remembers, per part, the highest seq the client has been shown and drops
live deltas at or below it, so a (re)connect neither loses nor repeats text. A client that
says which deltas it already has (SSE's Last-Event-ID) gets only the later ones: `catch_up`.

A delta carries a range of seqs (`first`..`seq`, the writer's window). One that does not start
right after what the client has (pieces lost on the way, or a range that began inside the
snapshot) is mended from the live tail before it goes out (`live`), so the client sees every
piece once, in order; when the tail cannot mend it, the client resumes from a new snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

from chat import events, live_text
from chat.fanout import Delivery, Reader
from chat.models import Part

log = logging.getLogger(__name__)
SEND, SKIP, MEND = "send", "skip", "mend"


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

    def judge(self, event: dict) -> str:
        """SEND a live event as it is, SKIP it, or MEND it (a delta that does not start right
        after what the client has: `mend`); what goes out counts as seen.

        A delta whose range ends at or below its part's seen seq is already on screen. A part
        state carries the text up to its own seq, so deltas up to that seq are dropped after
        it too.
        """
        if self.message_id is not None and event_message_id(event) != self.message_id:
            return SKIP
        if event["type"] == "part.delta":
            seen = self.seen.get(event["part_id"], 0)
            if event["seq"] <= seen:
                return SKIP
            if event.get("first", event["seq"]) != seen + 1:
                return MEND
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
        return SEND

    def mend(self, event: dict, pieces: list[str]) -> dict | None:
        """The delta the client needs in place of `event`: its part's pieces after what the
        client has, up to the event's seq, from `pieces` (the live tail after the seen seq);
        None when the tail lacks some (the client must resume from a snapshot)."""
        seen = self.seen.get(event["part_id"], 0)
        wanted = event["seq"] - seen
        if len(pieces) < wanted:
            return None
        self.seen[event["part_id"]] = event["seq"]
        return events.delta_event(
            event["part_id"],
            event["message_id"],
            event["seq"],
            "".join(pieces[:wanted]),
            event.get("t"),
            first=seen + 1,
        )

    def show(self, part: dict) -> None:
        """The client was given this part's text up to its seq."""
        self.holds(part["id"], part["seq"])

    def holds(self, part_id: int, seq: int) -> None:
        """The client has the part's pieces up to `seq` (a reconnect's Last-Event-ID and the
        pieces caught up after it)."""
        self.seen[part_id] = max(self.seen.get(part_id, 0), seq)


def catch_up(part: dict, after_seq: int) -> tuple[list[dict], dict]:
    """For a client holding a part's deltas up to `after_seq`: one delta of the pieces after it
    from the live tail (none when there are none), and the part's snapshot payload, without
    its text when the client has it.
    """
    if part["kind"] != Part.Kind.TEXT:
        return [], part
    pieces = live_text.tail(part["id"], after_seq)
    deltas = []
    if pieces:
        last = after_seq + len(pieces)
        text = "".join(pieces)
        deltas.append(
            events.delta_event(part["id"], part["message_id"], last, text, first=after_seq + 1)
        )
    if pieces or part["seq"] <= after_seq:
        part = {**part, "text": None}  # the client already has it
    return deltas, part


async def live(
    reader: Reader, resume: Resume, idle: float | None = None
) -> AsyncIterator[tuple[dict | None, Delivery | None]]:
    """The live events a client gets after its snapshot, each with the delivery it came in
    (None for a mended delta, which the caller encodes itself); (None, None) after `idle`
    seconds without one (a keepalive's turn). Ends when the reader must resume from a
    snapshot (`reader.lost` says why)."""
    while True:
        try:
            delivery = await reader.next(idle)
        except TimeoutError:
            yield None, None
            continue
        if delivery is None:
            return
        event = delivery.event
        verdict = resume.judge(event)
        if verdict == SKIP:
            continue
        if verdict == SEND:
            yield event, delivery
            continue
        seen = resume.seen.get(event["part_id"], 0)
        mended = resume.mend(event, await reader.hub.tail(event["part_id"], seen))
        if mended is None:
            reader.drop(f"pieces {seen + 1}..{event['seq']} of part {event['part_id']} are gone")
            return
        log.info(
            "part %s: pieces %s..%s mended from the tail", event["part_id"], seen + 1, event["seq"]
        )
        yield mended, None


class Writer(Protocol):
    """A connection that takes a ready frame at once (`chat.direct`'s writers)."""

    def ready(self) -> bool: ...

    def write(self, frame: bytes) -> None: ...


def send_now(
    writer: Writer,
    resume: Resume,
    delivery: Delivery,
    *,
    keep: str,
    name: str,
    frame: Callable[[Delivery], Any],
) -> bool:
    """Write a live event's frame now (made once per process as `name`), or skip it; False
    leaves it to the connection's own task: an event of type `keep` (it ends or closes the
    connection), a delta to mend, a writer not ready."""
    event = delivery.event
    if event["type"] == keep or not writer.ready():
        return False
    verdict = resume.judge(event)
    if verdict == SEND:
        writer.write(delivery.encoded(name, frame))
    return verdict in (SEND, SKIP)
