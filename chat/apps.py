"""Django app config for the chat."""

from django.apps import AppConfig


class ChatConfig(AppConfig):
    """Conversations, turns and their live updates."""

    name = "chat"

    def ready(self) -> None:
        from prometheus_client import REGISTRY

        from chat.metrics import collector

        REGISTRY.register(collector)  # /metrics reads it from Redis when scraped
