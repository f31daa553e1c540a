"""Live events written once per event and process, straight to each Daphne connection.

Through ASGI, every message to every socket walks Channels' session wrapper, Daphne's reply
handler and autobahn's `sendMessage`, which frames it again and formats its debug lines
whether or not they are logged: at a thousand readers most of Daphne's CPU per delivered
message went there (profile in docs/benchmarks.md). A server's frame is not masked, so
the bytes of one event's frame are the same for every socket: `text_frame` makes them
once, and `FrameWriter` hands them to the socket's Twisted transport, the same write
autobahn ends with. When that transport has nothing buffered, the frame goes to the socket
at once (`socket.send`, what Twisted's own `doWrite` calls): Twisted would otherwise
register the socket for writability, wait a loop turn and unregister it again, two epoll
changes per socket and event that cost more than the rest of the delivery; whatever the
socket does not take is handed to the transport, which keeps the order.

An SSE stream's events take the same shortcut past Django's response loop: `BodyWriter`
writes what Daphne's request would (`twisted.web`'s `Request.write`, with its chunked
encoding when the response has one) the same way, once the stream has sent what came before.

`DirectWriters`, the outermost middleware of both protocols, recognises Daphne's `send`
(its reply handler bound to the connection's protocol) and puts a writer in the scope under
`EXTENSION`; under any other server (Channels' test communicator, Django's test client)
there is none, and events go through ASGI as before.
"""

from __future__ import annotations

import functools
import socket
import struct

EXTENSION = "tandem.direct_writer"


def text_frame(payload: bytes) -> bytes:
    """One unmasked, unfragmented WebSocket text frame (RFC 6455 5.2) of UTF-8 `payload`."""
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", 0x81, size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", 0x81, 126, size)
    else:
        head = struct.pack("!BBQ", 0x81, 127, size)
    return head + payload


class FrameWriter:
    """Writes ready frames to one Daphne WebSocket connection."""

    __slots__ = ("protocol", "_socket")

    def __init__(self, protocol) -> None:
        self.protocol = protocol
        self._socket: socket.socket | None | bool = False  # False: not looked at yet

    def ready(self) -> bool:
        """Open, and nothing of autobahn's own waiting to go first (its queue is used only
        for chopped or synchronous sends, which Daphne makes none of)."""
        protocol = self.protocol
        return protocol.state == protocol.STATE_OPEN and not protocol.send_queue

    def write(self, frame: bytes) -> None:
        transport = self.protocol.transport
        if self._socket is False:
            self._socket = plain_socket(transport)
        write_through(transport, self._socket, frame)


def write_through(transport, sock: socket.socket | None, data: bytes) -> None:
    """`data` to the socket at once when the transport has nothing buffered; what the socket
    does not take (or all of it, without a plain socket) goes to the transport, in order."""
    if sock is not None and not transport._tempDataLen and not transport.dataBuffer:
        try:
            sent = sock.send(data)
        except OSError:  # full (EAGAIN) or broken: the transport buffers or reports it
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)


def plain_socket(transport) -> socket.socket | None:
    """The socket of a plain TCP transport (Twisted's `tcp.Server`), None for TLS or other
    transports, which get every frame through `transport.write`."""
    sock = getattr(transport, "socket", None)
    if not isinstance(sock, socket.socket) or getattr(transport, "TLS", True):
        return None
    if not hasattr(transport, "_tempDataLen") or not hasattr(transport, "dataBuffer"):
        return None
    return sock


class BodyWriter:
    """Writes more of a streaming HTTP response's body to one Daphne request: what
    `twisted.web`'s `Request.write` would send (chunked when the response is), straight to
    the socket as `FrameWriter` does. The socket gets TCP_NODELAY, as autobahn gives a
    WebSocket's: each event is a small write that should not wait for the last one's ACK."""

    __slots__ = ("request", "_socket")

    def __init__(self, request) -> None:
        self.request = request
        self._socket: socket.socket | None | bool = False  # False: not looked at yet

    def ready(self) -> bool:
        """The response has started and neither ended nor lost its client."""
        request = self.request
        return bool(request.startedWriting) and not request.finished and not request._disconnected

    def write(self, data: bytes) -> None:
        request = self.request
        transport = request.channel.transport
        if self._socket is False:
            self._socket = plain_socket(transport)
            if self._socket is not None:
                transport.setTcpNoDelay(True)
        request.sentLength += len(data)
        if request.chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        write_through(transport, self._socket, data)


def daphne_protocol(send):
    """The connection's protocol when `send` is Daphne's reply handler, else None."""
    if not isinstance(send, functools.partial) or len(send.args) != 1:
        return None
    handler = send.func
    owner = getattr(handler, "__self__", None)
    if getattr(handler, "__name__", "") != "handle_reply" or owner is None:
        return None
    if type(owner).__module__ != "daphne.server":
        return None
    return send.args[0]


def writer_for(scope, protocol) -> FrameWriter | BodyWriter | None:
    names = {
        "websocket": ("transport", "send_queue", "STATE_OPEN"),
        "http": ("startedWriting", "finished", "_disconnected", "channel", "chunked", "sentLength"),
    }.get(scope["type"], ())
    if not names or not all(hasattr(protocol, name) for name in names):
        return None
    return FrameWriter(protocol) if scope["type"] == "websocket" else BodyWriter(protocol)


class DirectWriters:
    """ASGI middleware: a writer in the scope of the connections Daphne serves."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        protocol = daphne_protocol(send)
        writer = None if protocol is None else writer_for(scope, protocol)
        if writer is not None:
            extensions = {**(scope.get("extensions") or {}), EXTENSION: writer}
            scope = {**scope, "extensions": extensions}
        return await self.app(scope, receive, send)
