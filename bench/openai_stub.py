"""An OpenAI-compatible engine stand-in that streams tokens at a fixed pace, in its own process.

    .venv/bin/python -m bench.openai_stub --port 18090 --rate 20

`bench.stream --source remote` points its Daphnes at this (`TANDEM_ENGINE`), so the web tier
streams through its real remote-engine client (`inference/provisioning/remote_engine.py`)
while no engine's cost shares the web process's CPU. It answers `GET /v1/models` and
`POST /v1/chat/completions` with `stream: true`: each reply sends one word every 1/rate s
(the first at once), `max_tokens` of them, then its finish reason, usage and `[DONE]`; a
reply whose client went away (Stop) is dropped at its next word.

One asyncio loop serves every stream, and one ticker writes every reply's due words: a
thousand replies at 20 words/s cost one timer wake-up per tick, not one per word, so the stub
keeps its pace far above what one web process can take.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import time

TEXT = (
    "Streaming text arrives one small piece at a time, and every piece travels from the engine "
    "through the writer thread, the live tail in Redis and the channel layer to each open "
    "socket. The reader sees the sentence grow word by word while the picture is still being "
    "drawn by a worker somewhere else."
)
WORDS = TEXT.split()
MODEL = "stub"
TICK = 0.005  # seconds between the ticker's rounds


def chunk(body: dict) -> bytes:
    """One SSE event in HTTP/1.1 chunked encoding."""
    return chunk_raw(b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")


class Stream:
    """One reply being written: its words are due every `interval` seconds."""

    __slots__ = ("writer", "left", "sent", "interval", "due", "prompt_tokens")

    def __init__(self, writer: asyncio.StreamWriter, tokens: int, interval: float) -> None:
        self.writer = writer
        self.left = tokens
        self.sent = 0
        self.interval = interval
        self.due = time.monotonic()
        self.prompt_tokens = 8


class Stub:
    """The server: a heap of replies ordered by their next word's due time."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self._heap: list[tuple[float, int, Stream]] = []
        self._order = itertools.count()
        self._wake = asyncio.Event()

    async def tick(self) -> None:
        """Write every due word, then sleep until the next is due."""
        while True:
            if not self._heap:
                self._wake.clear()
                await self._wake.wait()
            now = time.monotonic()
            while self._heap and self._heap[0][0] <= now:
                _, _, stream = heapq.heappop(self._heap)
                if self._step(stream):
                    stream.due += stream.interval
                    heapq.heappush(self._heap, (stream.due, next(self._order), stream))
            await asyncio.sleep(TICK)

    def _step(self, stream: Stream) -> bool:
        """Write the stream's next word (or its end); False once it is over."""
        writer = stream.writer
        if writer.is_closing():
            return False
        word = WORDS[stream.sent % len(WORDS)]
        piece = word if stream.sent == 0 else " " + word
        stream.sent += 1
        stream.left -= 1
        delta = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        data = chunk({"object": "chat.completion.chunk", "model": MODEL, **delta})
        if stream.left <= 0:
            end = {"index": 0, "delta": {}, "finish_reason": "length"}
            data += chunk({"object": "chat.completion.chunk", "model": MODEL, "choices": [end]})
            usage = {
                "prompt_tokens": stream.prompt_tokens,
                "completion_tokens": stream.sent,
                "total_tokens": stream.prompt_tokens + stream.sent,
            }
            data += chunk({"object": "chat.completion.chunk", "choices": [], "usage": usage})
            data += chunk_raw(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        writer.write(data)
        if stream.left <= 0:
            writer.close()
            return False
        return True

    def add(self, stream: Stream) -> None:
        heapq.heappush(self._heap, (stream.due, next(self._order), stream))
        self._wake.set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests on one connection (kept alive between them) until the client leaves."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(
                    (name.strip().lower(), value.strip())
                    for name, value in (line.split(":", 1) for line in lines[1:] if ":" in line)
                )
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                if method == "GET" and path.rstrip("/") == "/v1/models":
                    respond(writer, 200, {"object": "list", "data": [{"id": MODEL}]})
                elif method == "POST" and path == "/v1/chat/completions":
                    request = json.loads(body or b"{}")
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n\r\n"
                    )
                    self.add(Stream(writer, int(request.get("max_tokens") or 256), self.interval))
                    await reader.read()  # the client closes (the end, or Stop)
                    return
                else:
                    respond(writer, 404, {"error": {"message": f"no route {method} {path}"}})
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


def chunk_raw(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def respond(writer: asyncio.StreamWriter, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    writer.write(
        b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (status, len(payload), payload)
    )


async def serve(port: int, rate: float) -> None:
    stub = Stub(rate)
    server = await asyncio.start_server(stub.handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await asyncio.gather(server.serve_forever(), stub.tick())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="tokens/s per reply")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.rate))


if __name__ == "__main__":
    main()
