"""The streaming bench's clients: many WebSocket or SSE readers of a streaming reply.

Each client signs in with a session cookie, takes the snapshot the server sends first, then
records every `part.delta` as (emitted, received): `t` is stamped by the server when the
engine emitted the piece (the first of a delta's range), the receive time is taken here on
the same clock, with the number of pieces it carries. It checks that the deltas' seq ranges
follow each other without a gap or a repeat and that the reply's end reaches it, and builds
each part's text as a page does (the snapshot's text, then each delta's), for the bench to
compare with what was saved.

The SSE reader speaks HTTP/1.0 over a bare asyncio stream (no chunked encoding: the body is
the event stream itself) so that a thousand readers cost the shared CPU as little as possible.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import websockets

from tests.support.reply_reader import SseParser

CONNECT_TIMEOUT = 60.0


@dataclass
class Phase:
    """Counts clients still connecting; `connected` is set when none are."""

    pending: int
    connected: asyncio.Event = field(default_factory=asyncio.Event)

    def one_done(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.connected.set()


@dataclass
class Client:
    """One reader of one reply and what it saw."""

    conversation_id: int
    message_id: int
    cookie: str
    connected: bool = False
    finished: bool = False
    connect_seconds: float = 0.0
    error: str | None = None
    gaps: int = 0
    duplicates: int = 0
    deltas: list[tuple[float, float, int]] = field(default_factory=list)  # (t, received, pieces)
    next_seq: dict[int, int] = field(default_factory=dict)
    texts: dict[int, str] = field(default_factory=dict)  # part id: the text shown

    def take_parts(self, parts: list[dict]) -> None:
        for part in parts:
            if part.get("kind", "text") == "text":
                self.next_seq[part["id"]] = part["seq"] + 1
                self.texts[part["id"]] = part.get("text") or ""

    def take_status(self, message_id: int, status: str | None) -> None:
        if message_id == self.message_id and status != "in_progress":
            self.finished = True

    def handle(self, event: dict, received: float) -> None:
        """Apply one event in the WebSocket's shape."""
        kind = event["type"]
        if kind == "part.delta":
            if event["message_id"] != self.message_id:
                return
            part_id, first, seq = event["part_id"], event.get("first", event["seq"]), event["seq"]
            expected = self.next_seq.get(part_id, first)
            if first != expected:
                self.gaps += 1 if first > expected else 0
                self.duplicates += 1 if first < expected else 0
            if first == expected:
                self.texts[part_id] = self.texts.get(part_id, "") + event["text"]
            self.next_seq[part_id] = seq + 1
            if "t" in event:
                self.deltas.append((event["t"], received, seq - first + 1))
        elif kind == "message.state":
            self.take_status(event["message_id"], event["status"])
        elif kind == "snapshot":
            for message in event["messages"]:
                if message["id"] == self.message_id:
                    self.take_parts(message["parts"])
                    self.take_status(message["id"], message["status"])


async def connect_ws(client: Client, url: str, origin: str) -> websockets.ClientConnection:
    """Open the conversation socket and take its snapshot."""
    ws = await websockets.connect(
        url,
        origin=origin,
        additional_headers={"Cookie": client.cookie},
        open_timeout=CONNECT_TIMEOUT,
        ping_interval=None,
        max_queue=None,
        compression=None,
    )
    client.handle(json.loads(await asyncio.wait_for(ws.recv(), CONNECT_TIMEOUT)), time.time())
    return ws


async def listen_ws(client: Client, ws: websockets.ClientConnection) -> None:
    try:
        async for raw in ws:
            client.handle(json.loads(raw), time.time())
            if client.finished:
                return
        client.error = "socket closed before the reply ended"
    finally:
        await ws.close()


async def read_sse(reader: asyncio.StreamReader) -> AsyncIterator[dict]:
    """Events of a text/event-stream body, turned into the WebSocket's shapes."""
    parser = SseParser()
    while line := await reader.readline():
        if (event := parser.feed(line)) is not None:
            kind, data = event
            yield {"type": kind, "part": data} if kind == "part.state" else {"type": kind, **data}


async def connect_sse(
    client: Client, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, AsyncIterator[dict]]:
    """GET the reply's event stream; connected once its opening message.state arrives."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT
    )
    writer.write(
        f"GET /m/{client.message_id}/events HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
        f"Cookie: {client.cookie}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT)
    status = head.split(b" ", 2)[1]
    if status != b"200":
        writer.close()
        raise ConnectionError(f"HTTP {status.decode()}")
    events = read_sse(reader)
    async with asyncio.timeout(CONNECT_TIMEOUT):
        async for event in events:
            if event["type"] == "part.state":
                client.take_parts([event["part"]])
            else:
                client.handle(event, time.time())
            if event["type"] == "message.state":
                break
    return reader, writer, events


async def listen_sse(client: Client, writer: asyncio.StreamWriter, events) -> None:
    try:
        async for event in events:
            client.handle(event, time.time())
            if client.finished:
                return
        client.error = "stream ended before the reply did"
    finally:
        writer.close()


async def run_client(
    client: Client, transport: str, server, gate: asyncio.Semaphore, phase: Phase
) -> None:
    """Connect (at most `gate` at once), then read until the reply ends or the task is cancelled."""
    try:
        async with gate:
            started = time.perf_counter()
            if transport == "ws":
                url = f"ws://127.0.0.1:{server.port}/ws/conversations/{client.conversation_id}/"
                stream = await connect_ws(client, url, server.origin)
            else:
                stream = await connect_sse(client, server.port)
            client.connect_seconds = time.perf_counter() - started
    except Exception as exc:  # a refused or timed-out connect is a measured error
        client.error = f"connect: {type(exc).__name__}: {exc}"
        phase.one_done()
        return
    client.connected = not client.finished
    if client.finished:
        client.error = "the reply had ended before the client connected"
    phase.one_done()
    try:
        if transport == "ws":
            await listen_ws(client, stream)
        else:
            await listen_sse(client, stream[1], stream[2])
    except websockets.ConnectionClosed as exc:
        client.error = f"socket closed: {exc}"
    except (OSError, ValueError) as exc:
        client.error = f"read: {type(exc).__name__}: {exc}"
