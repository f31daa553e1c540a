"""One streaming POST to an engine, read by an asyncio protocol: the remote engine's hot path.

httpx streamed each reply's body through anyio, which re-registered the socket with epoll on
every read, and through four layers of async generators: at 200 replies × 20 tokens/s that
was 90 % of a core in the web process, more than the rest of the text path together
(docs/deploy.md, "Live replies per web process"). Here the socket's bytes go from
`data_received` through h11 (the HTTP/1.1 parser httpx itself uses) to the SSE lines and to
a handler, in one call per read, with no task woken per token.

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
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import h11


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
    """HTTP/1.1 response parsing and SSE line splitting for one request."""

    def __init__(self, stall: float) -> None:
        self.conn = h11.Connection(h11.CLIENT)
        self.stall = stall
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.on_line: OnLine | None = None  # set by relay(); body bytes are kept until then
        self._loop = asyncio.get_running_loop()
        self._head: asyncio.Future = self._loop.create_future()
        self._end: asyncio.Future = self._loop.create_future()
        self._kept: list[bytes] = []  # body bytes before relay() (a refusal's, or the first)
        self._partial = b""  # an SSE line not ended yet
        self._heard = time.monotonic()
        self._stall_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm()

    def _arm(self) -> None:
        self._stall_timer = self._loop.call_at(self._heard + self.stall, self._check_stall)

    def _check_stall(self) -> None:
        """Re-armed from the last bytes heard: one timer per `stall` seconds, not per read."""
        if time.monotonic() - self._heard >= self.stall:
            self._fail(ReadTimeout(f"nothing received for {self.stall:g} s"))
            self.transport.close()
        else:
            self._arm()

    def data_received(self, data: bytes) -> None:
        self._heard = time.monotonic()
        self.conn.receive_data(data)
        self._events()

    def eof_received(self) -> bool:
        self.conn.receive_data(b"")
        self._events()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        self._fail(ReadError(str(exc) if exc else "the connection closed before the body ended"))

    def _events(self) -> None:
        try:
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    return
                if isinstance(event, h11.Response):
                    self.status = event.status_code
                    if not self._head.done():
                        self._head.set_result(event.status_code)
                elif isinstance(event, h11.Data):
                    self._body(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    if self._partial and self.on_line is not None:
                        self._body(b"\n")
                    if not self._end.done():
                        self._end.set_result(None)
                    return
        except h11.RemoteProtocolError as exc:
            self._fail(ReadError(f"RemoteProtocolError: {exc}"))
            self.transport.close()

    def _body(self, data: bytes) -> None:
        if self.on_line is None:
            self._kept.append(data)
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b"data:") and self.on_line(line[5:].strip()):
                if not self._end.done():
                    self._end.set_result(None)
                self.on_line = lambda _: True  # anything after the end is ignored
                return

    def _fail(self, exc: StreamError) -> None:
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
        ends; StreamError when it stalled or dropped."""
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
    authority = host if parts.port is None else f"{host}:{port}"
    request = h11.Request(
        method="POST",
        target=(parts.path or "") + (f"?{parts.query}" if parts.query else ""),
        headers=[
            ("Host", authority),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload))),
            ("Connection", "close"),
            *headers.items(),
        ],
    )
    conn = protocol.conn
    protocol.transport.write(conn.send(request) + conn.send(h11.Data(data=payload)))
    conn.send(h11.EndOfMessage())
    try:
        await protocol.head()
    except TimeoutError:
        protocol.close()
        raise ReadTimeout(f"no response within {stall:g} s") from None
    except BaseException:
        protocol.close()
        raise
    return protocol
