"""Django app config for the chat."""

from django.apps import AppConfig


class ChatConfig(AppConfig):
    """Conversations, turns and their live updates."""

    name = "chat"
