"""WebSocket routes."""

from django.urls import path

from chat.consumers import ConversationConsumer, EchoConsumer

websocket_urlpatterns = [
    path("ws/diagnostics/echo/", EchoConsumer.as_asgi()),
    path("ws/conversations/<int:conversation_id>/", ConversationConsumer.as_asgi()),
]
