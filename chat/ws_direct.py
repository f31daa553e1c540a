"""WebSocket text frames written once per event and process, straight to each socket.

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

`DirectFrames`, the outermost WebSocket middleware, recognises Daphne's `send` (its
reply handler bound to the connection's protocol) and puts a `FrameWriter` in the scope
under `EXTENSION`; under any other server (Channels' test communicator) there is none, and
the consumer sends through ASGI as before.
"""

from __future__ import annotations

import functools
import socket
import struct

EXTENSION = "tandem.frame_writer"


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
        sock = self._socket
        if sock is False:
            sock = self._socket = plain_socket(transport)
        if sock is not None and not transport._tempDataLen and not transport.dataBuffer:
            try:
                sent = sock.send(frame)
            except OSError:  # full (EAGAIN) or broken: the transport buffers or reports it
                sent = 0
            if sent == len(frame):
                return
            frame = frame[sent:]
        transport.write(frame)


def plain_socket(transport) -> socket.socket | None:
    """The socket of a plain TCP transport (Twisted's `tcp.Server`), None for TLS or other
    transports, which get every frame through `transport.write`."""
    sock = getattr(transport, "socket", None)
    if not isinstance(sock, socket.socket) or getattr(transport, "TLS", True):
        return None
    if not hasattr(transport, "_tempDataLen") or not hasattr(transport, "dataBuffer"):
        return None
    return sock


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
    protocol = send.args[0]
    if not all(hasattr(protocol, name) for name in ("transport", "send_queue", "STATE_OPEN")):
        return None
    return protocol


class DirectFrames:
    """ASGI middleware: a `FrameWriter` in the scope of WebSocket connections Daphne serves."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        protocol = daphne_protocol(send)
        if protocol is not None:
            extensions = {**(scope.get("extensions") or {}), EXTENSION: FrameWriter(protocol)}
            scope = {**scope, "extensions": extensions}
        return await self.app(scope, receive, send)
