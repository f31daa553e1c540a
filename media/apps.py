"""Django app config for media work."""

from django.apps import AppConfig


class MediaConfig(AppConfig):
    """Image generation run by Celery workers."""

    name = "media"
