"""The remote engine's SSE reader (inference/provisioning/sse_stream.py) against real sockets:
a server on a free port writes the response's bytes as an engine would, however it frames
them, splits them or breaks off."""

from __future__ import annotations

import asyncio
import json

import pytest

from inference.provisioning import sse_stream

HEAD_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
HEAD_UNFRAMED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}).encode() + b"\n\n"


async def serve(writes: list[bytes], then_close: bool = True, pause: float = 0.0):
    """A server that reads one request, then writes `writes` one by one; its requests."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        requests.append(head + await reader.readexactly(length))
        for data in writes:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(pause)
        if then_close:
            writer.close()
        else:
            await reader.read()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/chat/completions", requests


async def read_all(writes: list[bytes], stall: float = 5.0, then_close: bool = True, **kw):
    """Stream from a server writing `writes`; (status, the data lines, the requests)."""
    server, url, requests = await serve(writes, then_close, **kw)
    async with server:
        stream = await sse_stream.open_stream(url, b'{"stream": true}', {}, 5.0, stall)
        lines: list[bytes] = []

        def on_line(data: bytes) -> bool:
            lines.append(data)
            return data == b"[DONE]"

        try:
            await stream.relay(on_line)
        finally:
            stream.close()
        return stream.status, lines, requests


def texts(lines: list[bytes]) -> list[str]:
    return [
        json.loads(line)["choices"][0]["delta"]["content"] for line in lines if line[:1] == b"{"
    ]


def test_chunked_events_split_anywhere_arrive_whole_and_in_order():
    body = b"".join(chunked(event(word)) for word in ("one", " two", " three"))
    body += chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    stream = HEAD_CHUNKED + body
    writes = [stream[i : i + 7] for i in range(0, len(stream), 7)]  # 7 bytes a read
    status, lines, requests = asyncio.run(read_all(writes, pause=0.001))
    assert status == 200
    assert texts(lines) == ["one", " two", " three"] and lines[-1] == b"[DONE]"
    request = requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nContent-Length: 16\r\n" in request and request.endswith(b'{"stream": true}')


def test_a_body_without_length_or_chunks_ends_when_the_engine_closes():
    writes = [
        HEAD_UNFRAMED,
        event("alpha"),
        b'data: {"choices": [{"delta": {"content": "omega"}}]}',
    ]
    status, lines, _ = asyncio.run(read_all(writes))
    assert status == 200 and texts(lines) == ["alpha", "omega"]  # the last line had no newline


def test_a_chunked_body_cut_short_is_a_read_error():
    with pytest.raises(sse_stream.ReadError, match="closed before the body ended"):
        asyncio.run(read_all([HEAD_CHUNKED, chunked(event("half"))]))


def test_bytes_that_are_not_http_are_a_read_error():
    with pytest.raises(sse_stream.ReadError, match="not HTTP/1.1"):
        asyncio.run(read_all([b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"]))


@pytest.mark.parametrize("pause", [0.0, 0.2], ids=["before relay", "during relay"])
def test_a_line_the_handler_cannot_take_ends_the_stream_with_its_error(pause):
    writes = [HEAD_CHUNKED, chunked(b"data: {not json\n\n")]
    with pytest.raises(json.JSONDecodeError):

        async def run() -> None:
            server, url, _ = await serve(writes, then_close=False, pause=pause)
            async with server:
                stream = await sse_stream.open_stream(url, b"{}", {}, 5.0, 5.0)
                await stream.relay(lambda data: json.loads(data) is None)

        asyncio.run(run())


def test_a_refusal_keeps_its_status_and_body():
    payload = b'{"error": {"message": "too long"}}'
    head = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(payload)

    async def run() -> tuple[int, bytes]:
        server, url, _ = await serve([head, payload[:10], payload[10:]], pause=0.01)
        async with server:
            stream = await sse_stream.open_stream(url, b"{}", {}, 5.0, 5.0)
            return stream.status, await stream.body()

    assert asyncio.run(run()) == (400, payload)


def test_silence_past_the_stall_is_a_read_timeout():
    with pytest.raises(sse_stream.ReadTimeout):
        asyncio.run(read_all([HEAD_CHUNKED, chunked(event("one"))], stall=0.3, then_close=False))


def test_a_header_that_would_split_the_request_is_refused_before_connecting():
    async def run() -> None:
        await sse_stream.open_stream(
            "http://127.0.0.1:9/v1/chat/completions",
            b"{}",
            {"Authorization": "Bearer a\r\nX-Injected: 1"},
            5.0,
            5.0,
        )

    with pytest.raises(ValueError, match="Authorization"):
        asyncio.run(run())  # port 9 refuses: a connect would be a ConnectError
