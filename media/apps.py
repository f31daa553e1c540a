"""Django app config for media work."""

from django.apps import AppConfig


class MediaConfig(AppConfig):
    """Image generation run by Celery workers."""

    name = "media"

    def ready(self) -> None:
        from chat.metrics import collector
        from media import metrics

        collector.add(metrics.families)  # scraped with the chat's counters, one round trip
