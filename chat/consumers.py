"""WebSocket consumers."""

from __future__ import annotations

import asyncio
import functools
import json
import logging

import redis
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from chat import direct, fanout
from chat.events import encode
from chat.kept_connections import readers
from chat.models import Conversation
from chat.resume import Resume, live, send_now
from chat.snapshot import conversation_snapshot
from chat.socket_auth import DATABASE_UNAVAILABLE, UNAVAILABLE_ERRORS, refused

RESUME = 4000  # the browser reconnects and starts over from a snapshot
UNAUTHENTICATED = 4401
NOT_FOUND = 4404
LIVE_EVENTS_UNAVAILABLE = 1011  # Redis did not answer: the page reconnects later
log = logging.getLogger(__name__)


class EchoConsumer(AsyncJsonWebsocketConsumer):
    """Diagnostic echo that goes through the channel layer, proving Redis carries events.

    A frame is not answered directly: it is sent to this consumer's own channel and comes
    back through the layer, the same path Celery workers and other web processes use.
    """

    async def connect(self) -> None:
        if not self.scope["user"].is_authenticated:
            await self.close(code=UNAUTHENTICATED)
            return
        await self.accept()

    async def receive_json(self, content, **kwargs) -> None:
        await self.channel_layer.send(self.channel_name, {"type": "echo.reply", "payload": content})

    async def echo_reply(self, event: dict) -> None:
        """Handle the message that came back through the channel layer."""
        await self.send_json({"echo": event["payload"], "via": "channel_layer"})


def owned_snapshot(user, conversation_id: int) -> list[dict] | None:
    """The snapshot of the user's conversation, or None when it is not theirs: one trip to
    the readers' thread for both."""
    if not Conversation.objects.filter(pk=conversation_id, owner=user).exists():
        return None
    return conversation_snapshot(conversation_id)


class ConversationConsumer(AsyncWebsocketConsumer):
    """Live events of one conversation for its owner: a snapshot, then the live tail, by the
    resume protocol of `chat.resume`.

    The events come from the process's subscription (`chat.fanout`), not the channel layer.
    Under Daphne each event's frame is made once per process and written to the socket as
    it is delivered (`chat.direct`); a task per socket sends what cannot go that way (a
    delta mended from the tail, the close after a deletion) and, under other servers, all.
    """

    channel_layer_alias = "live events come from chat.fanout"  # no layer: no channel per socket

    async def connect(self) -> None:
        self.conversation_id = int(self.scope["url_route"]["kwargs"]["conversation_id"])
        # Accepted before anything else is read: under load a slow join or snapshot makes a
        # later first frame, not a handshake past the server's timeout; and a refusal's close
        # code reaches the browser (a refused handshake is a bare 403). Nothing is sent before
        # the conversation is known to be the user's.
        await self.accept()
        if not self.scope["user"].is_authenticated:
            await self.close(code=UNAUTHENTICATED)
            return
        try:
            self.reader = await fanout.hub().join(self.conversation_id)
        except (redis.RedisError, OSError, TimeoutError) as exc:
            log.warning(
                "websocket closed: no live events for conversation %s: %s",
                self.conversation_id,
                exc,
            )
            await self.close(code=LIVE_EVENTS_UNAVAILABLE)
            return
        try:
            messages = await readers.run(owned_snapshot, self.scope["user"], self.conversation_id)
            if messages is not None:
                resume = Resume(part for message in messages for part in message["parts"])
                await self.send_event({"type": "snapshot", "messages": messages})
        except UNAVAILABLE_ERRORS as exc:
            self.reader.close()
            refused(self.scope["path"], exc)
            await self.close(code=DATABASE_UNAVAILABLE)
            return
        except BaseException:  # e.g. the client left before its snapshot: leave the hub too
            self.reader.close()
            raise
        if messages is None:
            self.reader.close()
            await self.close(code=NOT_FOUND)
            return
        log.info("websocket joined conversation %s", self.conversation_id)
        writer = self.scope.get("extensions", {}).get(direct.EXTENSION)
        if writer is not None:
            self.reader.direct = functools.partial(
                send_now,
                writer,
                resume,
                keep="conversation.deleted",
                name="ws",
                frame=delivery_frame,
            )
        self.pump = asyncio.create_task(self.forward(resume))

    async def forward(self, resume: Resume) -> None:
        """Send the live events; close for a resume when this socket was dropped."""
        try:
            async for event, delivery in live(self.reader, resume):
                await self.send(text_data=encode(event) if delivery is None else delivery.raw)
                if event["type"] == "conversation.deleted":
                    # The conversation is gone: close as for any conversation not found.
                    await self.close(code=NOT_FOUND)
                    return
        except (redis.RedisError, OSError) as exc:
            self.reader.drop(f"the live tail could not be read: {exc}")
        log.info("websocket of conversation %s resumes: %s", self.conversation_id, self.reader.lost)
        await self.close(code=RESUME)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "reader"):
            self.reader.close()
        if hasattr(self, "pump"):
            self.pump.cancel()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Clients only listen; anything they send is answered with an error, not a crash."""
        try:
            frame = json.loads(text_data or "")
        except (TypeError, ValueError, RecursionError):  # deep nesting exhausts the parser
            await self.send_event({"type": "error", "error": "Frames must be JSON."})
            return
        if isinstance(frame, dict) and frame.get("type") == "ping":
            await self.send_event({"type": "pong"})
            return
        await self.send_event({"type": "error", "error": "Unknown frame: this socket listens."})

    async def send_event(self, event: dict) -> None:
        await self.send(text_data=json.dumps(event))


def delivery_frame(delivery: fanout.Delivery) -> bytes:
    return direct.text_frame(delivery.raw.encode())
