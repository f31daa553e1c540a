"""Celery tasks of the media queue."""

from celery import shared_task


@shared_task(name="media.echo", ignore_result=False)
def echo(payload: dict) -> dict:
    """Diagnostic round trip: proves a worker consumes the media queue and answers via Redis."""
    return {"echo": payload}
