"""Rendering one image part inside a worker: the logic behind the `render_image` task.

Delivery is at least once (acks_late, redelivery after a lost worker, the sweeper sending a
queued part again), so this is written to be repeated: a part already final is left alone, a
part running elsewhere is left alone unless this delivery replaces a dead one, and when two
renders do race, only the first to finish records a picture; the other deletes its file.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from dataclasses import dataclass

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import DatabaseError
from django.utils import timezone

from chat.history import user_words
from chat.models import Part
from chat.parts import part_progress, part_transition
from chat.states import TERMINAL
from config.redis_client import redis_client
from media import metrics
from media.backends import configured_backend
from media.backends.base import PermanentImageError, TransientImageError, prompt_seed

log = logging.getLogger(__name__)

# Progress reaches the database and the browser at most this often.
PROGRESS_INTERVAL = 0.5
RESTARTS_KEY = "tandem:image-restarts:{}"


@dataclass(frozen=True)
class Retry:
    """The task should be sent again after `countdown` seconds because of `error`."""

    countdown: float
    error: Exception


class RenderAbandoned(Exception):
    """The part stopped being `running` mid-render (cancelled, or failed by the sweeper)."""


class ProgressReporter:
    """The backend's progress callback: `part_progress` (save and announce), throttled.

    The save is conditional on the part still running, which is also how a cancel reaches a
    render in progress: the next report finds the part changed and stops the backend. It also
    enforces the soft time limit itself: Celery's signal can land inside a callee's broad
    `except Exception` (sending an event, say) and be lost, and the render must stop anyway.
    """

    def __init__(self, part: Part, deadline: float, interval: float = PROGRESS_INTERVAL) -> None:
        self.part = part
        self.deadline = deadline
        self.interval = interval
        self.last_report = float("-inf")

    def __call__(self, fraction: float) -> None:
        now = time.monotonic()
        if now >= self.deadline:
            raise SoftTimeLimitExceeded
        if now - self.last_report < self.interval:
            return
        self.last_report = now
        if not part_progress(self.part, fraction):
            raise RenderAbandoned


def render(part_id: int, *, task_id: str, retries: int, redelivered: bool) -> Retry | None:
    """Render the part and record the outcome; a Retry when a transient error should be retried.

    `retries` counts the Celery retries before this run; `redelivered` says the broker gave
    this message again because the worker that had it died.
    """
    deadline = time.monotonic() + settings.CELERY_TASK_SOFT_TIME_LIMIT
    part = Part.objects.select_related("message").filter(pk=part_id).first()
    if part is None or part.kind != Part.Kind.IMAGE:
        log.warning("task %s: no image part %s; nothing to do", task_id, part_id)
        return None
    if part.state in TERMINAL:
        log.info(
            "task %s: image part %s is already %s; nothing to do", task_id, part_id, part.state
        )
        return None
    if part.state == Part.State.RUNNING:
        if not (redelivered or retries):
            log.info(
                "task %s: image part %s is already running elsewhere; nothing to do",
                task_id,
                part_id,
            )
            return None
        if redelivered and count_restart(task_id) > settings.TANDEM_IMAGE_MAX_RETRIES:
            # A render that kills its worker (out of memory, say) would otherwise loop forever.
            fail(part_id, "Failed: the worker drawing this image died every time it tried.")
            return None
    running = part_transition(
        part_id,
        Part.State.RUNNING,
        expect=part.state,
        started_at=timezone.now(),
        progress=0.0,
        error="",
    )
    if running is None:
        log.info(
            "task %s: image part %s is already taken by another delivery; nothing to do",
            task_id,
            part_id,
        )
        return None
    if redelivered and part.state == Part.State.RUNNING:
        metrics.image_retried("redelivered")
    prompt = user_words(running.message)
    try:
        png = configured_backend().render(
            prompt, seed=prompt_seed(prompt), on_progress=ProgressReporter(running, deadline)
        )
        finish(running, png)
    except RenderAbandoned:
        log.info("stopped rendering image part %s: it is no longer running", part_id)
    except SoftTimeLimitExceeded:
        fail(part_id, f"Timed out after {settings.CELERY_TASK_SOFT_TIME_LIMIT} s.")
    except (TransientImageError, DatabaseError) as exc:
        if retries >= settings.TANDEM_IMAGE_MAX_RETRIES:
            tries = retries + 1
            fail(part_id, f"Failed after {tries} {'try' if tries == 1 else 'tries'}: {exc}")
        else:
            metrics.image_retried("transient")
            return Retry(countdown=backoff(retries), error=exc)
    except PermanentImageError as exc:
        fail(part_id, f"Failed: {exc}")
    except Exception as exc:  # a backend bug must still end the part, not leave it running
        log.exception("image part %s: the backend crashed", part_id)
        fail(part_id, f"The image backend crashed ({type(exc).__name__}: {exc}).")
    return None


def count_restart(task_id: str) -> int:
    """Count one more restart of a task after its worker died; the count is kept a day."""
    key = RESTARTS_KEY.format(task_id)
    count, _ = redis_client(5.0).pipeline().incr(key).expire(key, 86_400).execute()
    return count


def finish(part: Part, png: bytes) -> None:
    """Store the PNG under a generated name and mark the part succeeded.

    If another render got there first (or the part was cancelled meanwhile) the transition is
    refused, and this render's file is deleted so that one part never leaves two files.
    """
    field = Part._meta.get_field("image")
    name = field.storage.save(
        field.generate_filename(part, f"part-{part.pk}-{secrets.token_hex(6)}.png"),
        ContentFile(png),
    )
    previous = Part.objects.filter(pk=part.pk).values_list("previous_image", flat=True).first()
    try:
        done = part_transition(
            part.pk,
            Part.State.SUCCEEDED,
            image=name,
            previous_image="",
            progress=1.0,
            finished_at=timezone.now(),
        )
    except BaseException:  # a time limit or database error mid-save: keep no orphan file
        field.storage.delete(name)
        raise
    if done is None:
        field.storage.delete(name)
        log.info("image part %s was finished elsewhere; discarded this render", part.pk)
    elif previous:  # a "New image" succeeded: the picture it replaced goes
        field.storage.delete(previous)


def fail(part_id: int, reason: str) -> None:
    """Mark the part failed with a reason a person can read."""
    log.warning("image part %s failed: %s", part_id, reason)
    part_transition(part_id, Part.State.FAILED, error=reason, finished_at=timezone.now())


def backoff(retries: int) -> float:
    """Exponential backoff with jitter: base * 2^retries, capped, then between half and all."""
    ceiling = min(
        settings.TANDEM_IMAGE_RETRY_BACKOFF * 2**retries, settings.TANDEM_IMAGE_RETRY_BACKOFF_MAX
    )
    return random.uniform(ceiling / 2, ceiling)
