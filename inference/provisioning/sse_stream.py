"""One streaming POST to an engine, read by an asyncio protocol: the remote engine's hot path.

httpx streamed each reply's body through anyio, which re-registered the socket with epoll on
every read, and through four layers of async generators: at 200 replies × 20 tokens/s that
was 90 % of a core in the web process, more than the rest of the text path together
(docs/deploy.md, "Live replies per web process"). Here the socket's bytes go from
`data_received` through httptools (llhttp, the parser in C that uvicorn uses) to the SSE
lines and to a handler, in one call per read, with no task woken per token. h11, the pure
Python parser httpx uses, took ~10 µs a token's chunk where httptools takes ~1 µs.

A stream's life: `open_stream` connects (ConnectError / ConnectTimeout), sends the request
and returns once the response's head has come (its status); `body()` gathers a refusal's
body; `relay()` hands every `data:` line to the handler and returns when the body ends (or
raises `ReadTimeout` after `stall` seconds with no bytes, `ReadError` when the connection
drops). Closing the transport (Stop, the end) closes the connection: the engine drops the
request.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools


class StreamError(Exception):
    """The engine could not be reached, or the stream broke."""


class ConnectError(StreamError):
    pass


class ConnectTimeout(StreamError):
    pass


class ReadTimeout(StreamError):
    pass


class ReadError(StreamError):
    pass


OnLine = Callable[[bytes], bool]  # a `data:` line's payload; True: the stream is over


class SseProtocol(asyncio.Protocol):
    """HTTP/1.1 response parsing and SSE line splitting for one request; httptools calls the
    `on_*` methods from `feed_data`."""

    def __init__(self, stall: float) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.stall = stall
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.on_line: OnLine | None = None  # set by relay(); body bytes are kept until then
        self._loop = asyncio.get_running_loop()
        self._head: asyncio.Future = self._loop.create_future()
        self._end: asyncio.Future = self._loop.create_future()
        self._kept: list[bytes] = []  # body bytes before relay() (a refusal's, or the first)
        self._partial = b""  # an SSE line not ended yet
        self._framed = False  # a length or chunks: the body ends by itself, not at the close
        self._heard = self._loop.time()
        self._stall_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm()

    def _arm(self) -> None:
        self._stall_timer = self._loop.call_at(self._heard + self.stall, self._check_stall)

    def _check_stall(self) -> None:
        """Re-armed from the last bytes heard: one timer per `stall` seconds, not per read."""
        if self._loop.time() - self._heard >= self.stall:
            self._fail(ReadTimeout(f"nothing received for {self.stall:g} s"))
            self.transport.close()
        else:
            self._arm()

    def data_received(self, data: bytes) -> None:
        self._heard = self._loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ReadError(f"the response is not HTTP/1.1: {exc}"))
            self.transport.close()

    def eof_received(self) -> bool:
        """A body with neither a length nor chunks ends when the engine closes."""
        if self._head.done() and not self._framed:
            self.on_message_complete()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        self._fail(ReadError(str(exc) if exc else "the connection closed before the body ended"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if not self._head.done():
            self._head.set_result(self.status)

    def on_body(self, body: bytes) -> None:
        self._body(body)

    def on_message_complete(self) -> None:
        if self._partial and self.on_line is not None:
            self._body(b"\n")
        if not self._end.done():
            self._end.set_result(None)

    def _body(self, data: bytes) -> None:
        if self.on_line is None:
            self._kept.append(data)
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            try:
                over = self.on_line(line[5:].strip())
            except Exception as exc:  # a line the handler cannot take: relay() raises it
                self._fail(exc)
                self.transport.close()
                over = True
            if over:
                if not self._end.done():
                    self._end.set_result(None)
                self.on_line = lambda _: True  # anything after the end is ignored
                return

    def _fail(self, exc: Exception) -> None:
        for future in (self._head, self._end):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # read: a stream ended by Stop never awaits it

    async def head(self) -> int:
        async with asyncio.timeout(self.stall):
            return await self._head

    async def body(self) -> bytes:
        """A refusal's whole body (or what came before the connection went)."""
        try:
            async with asyncio.timeout(self.stall):
                await self._end
        except (StreamError, TimeoutError):
            pass
        return b"".join(self._kept)

    async def relay(self, on_line: OnLine) -> None:
        """Hand every `data:` line to `on_line` until it says the stream is over or the body
        ends; StreamError when it stalled or dropped, and the handler's own error when it
        could not take a line (not a fault of the connection: the caller logs it)."""
        self.on_line = on_line
        kept, self._kept = self._kept, []
        for data in kept:
            self._body(data)
        if self._partial and self._end.done():  # the body had ended without a last newline
            self._body(b"\n")
        await self._end

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_stream(
    url: str, payload: bytes, headers: dict[str, str], connect_timeout: float, stall: float
) -> SseProtocol:
    """POST `payload` (JSON) to `url` and wait for the response's head."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if https else 80)
    authority = host if parts.port is None else f"{host}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = request_head(target, authority, len(payload), headers) + payload
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(connect_timeout):
            _, protocol = await loop.create_connection(
                lambda: SseProtocol(stall),
                host,
                port,
                ssl=ssl.create_default_context() if https else None,
                server_hostname=host if https else None,
            )
    except TimeoutError:
        raise ConnectTimeout(f"no connection to {host}:{port} in {connect_timeout:g} s") from None
    except OSError as exc:
        raise ConnectError(str(exc) or type(exc).__name__) from exc
    protocol.transport.write(request)
    try:
        await protocol.head()
    except TimeoutError:
        protocol.close()
        raise ReadTimeout(f"no response within {stall:g} s") from None
    except BaseException:
        protocol.close()
        raise
    return protocol


def request_head(target: str, authority: str, length: int, headers: dict[str, str]) -> bytes:
    """A POST's request line and headers; a header that would split the request is refused."""
    fields = {
        "Host": authority,
        "Content-Type": "application/json",
        "Content-Length": str(length),
        "Connection": "close",
        **headers,
    }
    for name, value in fields.items():
        if any(char in f"{name}{value}" for char in "\r\n\0"):
            raise ValueError(f"the header {name!r} has a line break or NUL in it")
    lines = [f"POST {target} HTTP/1.1", *(f"{name}: {value}" for name, value in fields.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
