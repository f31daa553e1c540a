"""WebSocket consumers."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

UNAUTHENTICATED = 4401


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
