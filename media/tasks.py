"""Celery tasks of the media queue; each is a thin shell around a service."""

import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError

from media import rendering, sweeper
from media.services import RENDER_TASK

log = logging.getLogger(__name__)


@shared_task(name="media.echo", ignore_result=False)
def echo(payload: dict) -> dict:
    """Diagnostic round trip: proves a worker consumes the media queue and answers via Redis."""
    return {"echo": payload}


# max_retries=None: the rendering service counts retries against TANDEM_IMAGE_MAX_RETRIES, and
# bounds the waits for an unavailable database (`database_waits`, which Celery counts too).
@shared_task(bind=True, name=RENDER_TASK, max_retries=None)
def render_image(self, part_id: int, database_waits: int = 0) -> None:
    """Draw one image part; state, progress and errors are recorded on the part itself."""
    retry = rendering.render(
        part_id,
        task_id=self.request.id,
        retries=self.request.retries - database_waits,
        redelivered=bool((self.request.delivery_info or {}).get("redelivered")),
        database_waits=database_waits,
    )
    if retry is not None:
        raise self.retry(
            exc=retry.error,
            countdown=retry.countdown,
            kwargs={"database_waits": retry.database_waits},
        )


@shared_task(name="media.sweep")
def sweep() -> None:
    """Repair parts whose worker or web process went away (run by celery beat).

    While the database is unavailable there is nothing to repair with: one line, no traceback
    every interval, and the next sweep after it returns does the work.
    """
    try:
        sweeper.sweep()
    except (OperationalError, InterfaceError) as exc:
        log.warning("sweep skipped: the database is unavailable (%s)", exc)
