"""Reading a reply's event stream (GET /m/<id>/events) as the page's SSE fallback does, and
putting its text together from the deltas, to compare with the text saved in the database.

Used by the chaos scenarios and the soak (bench/soak.py). The request is HTTP/1.0 over a bare
socket, so the body is the event stream itself (no chunking) and the reader can drop it at
any moment and resume with Last-Event-ID, as a browser that lost its connection does.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field

FINAL_STATES = {"succeeded", "failed", "cancelled", "interrupted"}


@dataclass
class StreamedText:
    """What one reader saw of a text part: the text put together from deltas, and its seq."""

    part_id: int
    text: str = ""
    seq: int = 0
    gaps: int = 0
    final_state: str | None = None
    resumes: int = 0
    resyncs: int = 0  # streams reopened after a missed delta (as the page does)
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each delta
    other_states: dict[int, str] = field(default_factory=dict)  # the message's other parts


class StreamRefused(ConnectionError):
    """The event stream answered with something other than 200."""

    def __init__(self, status: int) -> None:
        super().__init__(f"event stream answered {status}")
        self.status = status


class SseParser:
    """Turns the lines of a text/event-stream, fed one by one, into (event, data) pairs."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.data: dict | None = None

    def feed(self, line: bytes) -> tuple[str | None, dict] | None:
        """The event this line completes, if any."""
        line = line.rstrip(b"\r\n")
        if line.startswith(b"event:"):
            self.kind = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            self.data = json.loads(line[5:])
        elif not line and self.data is not None:
            event = (self.kind, self.data)
            self.kind, self.data = None, None
            return event
        return None


def sse_events(stream):
    """(event, data) pairs of a text/event-stream read from a file-like stream."""
    parser = SseParser()
    while line := stream.readline():
        if (event := parser.feed(line)) is not None:
            yield event


def open_stream(
    port: int, cookie: str, message_id: int, last_event_id: int | None, timeout: float = 180
):
    """GET the message's event stream; returns the body as a file, or raises StreamRefused."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    resume = "" if last_event_id is None else f"Last-Event-ID: {last_event_id}\r\n"
    sock.sendall(
        f"GET /m/{message_id}/events HTTP/1.0\r\nHost: 127.0.0.1\r\n"
        f"Cookie: {cookie}\r\nAccept: text/event-stream\r\n{resume}\r\n".encode()
    )
    stream = sock.makefile("rb")
    sock.close()  # the file keeps the socket open until it is closed itself
    status = int(stream.readline().split()[1])
    while stream.readline() not in (b"\r\n", b"\n", b""):
        pass
    if status != 200:
        stream.close()
        raise StreamRefused(status)
    return stream


def read_stream(
    stream, seen: StreamedText, drop_after: int | None = None, resync: bool = False
) -> bool:
    """Read into `seen` until the reply ends (True) or `drop_after` deltas came (False); with
    `resync`, a missed delta also returns False, so that the caller resumes from `seen.seq`
    with Last-Event-ID, as the page starts over from a snapshot when it misses a piece.

    Until the stream's opening message.state, a part state with text is the snapshot (or the
    catch-up) and replaces what the reader had; after it, text comes only from deltas, and the
    final part state's seq tells whether any delta was missed (counted in `gaps`).
    """
    opening, deltas = True, 0
    for kind, data in sse_events(stream):
        if kind == "part.delta" and data["part_id"] == seen.part_id:
            deltas += 1
            seen.arrivals.append(time.monotonic())
            first = data.get("first", data["seq"])  # a delta carries pieces first..seq
            if first == seen.seq + 1:
                seen.text += data["text"]
                seen.seq = data["seq"]
            elif first > seen.seq + 1 and resync:
                seen.resyncs += 1
                return False
            elif first > seen.seq + 1:
                seen.gaps += 1
            if drop_after is not None and deltas >= drop_after:
                return False
        elif kind == "part.state" and data["id"] == seen.part_id:
            if opening and data["text"] is not None and data["seq"] >= seen.seq:
                seen.text, seen.seq = data["text"], data["seq"]
            if data["state"] in FINAL_STATES:
                seen.final_state = data["state"]
                if data["seq"] != seen.seq:
                    seen.gaps += 1
        elif kind == "part.state":
            seen.other_states[data["id"]] = data["state"]
        elif kind == "message.state":
            opening = False
            if data["status"] != "in_progress":
                return True
    raise ConnectionError("the event stream ended before the reply did")
