"""Rendering one image part inside a worker: the logic behind the `render_image` task.

Delivery is at least once (acks_late, redelivery after a lost worker, the sweeper sending a
queued part again), so this is written to be repeated: a part already final is left alone, a
part running elsewhere is left alone unless this delivery replaces a dead one, and when two
renders do race, only the first to finish records a picture; the other deletes its file.
"""

from __future__ import annotations

import errno
import logging
import random
import secrets
import time
from dataclasses import dataclass, replace

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.models import FileField
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
# While the database is unavailable a render can neither record its state nor fail: it asks
# again this often (so it resumes within a second of the database's return), for at most
# DATABASE_WAIT seconds; those waits are not render failures and use none of its retries.
DATABASE_RETRY_INTERVAL = 1.0
DATABASE_WAIT = 600.0
# The errors of a database that is down or whose connection died (not a bad query).
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
# The storage's errors a person can act on, said in their words (the media folder is theirs).
STORAGE_PROBLEMS = {
    errno.EACCES: "the server may not write to its media folder",
    errno.EPERM: "the server may not write to its media folder",
    errno.EROFS: "the media folder is read-only",
    errno.ENOSPC: "the media folder's disk is full",
    errno.EDQUOT: "the media folder's disk quota is used up",
    errno.ENOTDIR: "the media folder's path is not a folder",
}


def bare(error: Exception) -> Exception:
    """`error` (and the errors it came from) without tracebacks, to be kept for a retry.

    Celery's retry ends in a reference cycle (its exception, its traceback, the tracing
    frame), which only a full garbage collection frees, and a busy worker runs one rarely (793
    retries were waiting in the soak's pool process). Kept with its traceback, the error held
    the render's frames, and so the half-drawn picture, in that cycle too.
    """
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


@dataclass(frozen=True)
class Retry:
    """The task should be sent again after `countdown` seconds because of `error`;
    `database_waits` counts the tries so far that found the database unavailable."""

    countdown: float
    error: Exception
    database_waits: int = 0


class StorageFailed(Exception):
    """The picture was drawn but could not be stored; the message says why, for the user."""


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


def render(
    part_id: int, *, task_id: str, retries: int, redelivered: bool, database_waits: int = 0
) -> Retry | None:
    """Render the part and record the outcome; a Retry when it should be tried again.

    `retries` counts the Celery retries before this run that a render error caused,
    `database_waits` those that found the database unavailable (not counted against the
    limit: nothing can be recorded, not even a failure, until it is back); `redelivered`
    says the broker gave this message again because the worker that had it died.
    """
    try:
        retry = render_once(
            part_id,
            task_id=task_id,
            retries=retries,
            redelivered=redelivered,
            resumed=database_waits > 0,
        )
    except DATABASE_UNAVAILABLE as exc:
        waited = (database_waits + 1) * DATABASE_RETRY_INTERVAL
        if waited > DATABASE_WAIT:
            log.warning(
                "image part %s: the database has been unavailable for %.0f s; giving up (the "
                "sweeper fails the part once it is back): %s",
                part_id,
                waited,
                exc,
            )
            return None
        log.warning(
            "image part %s: the database is unavailable; trying again in %.0f s: %s",
            part_id,
            DATABASE_RETRY_INTERVAL,
            exc,
        )
        return Retry(DATABASE_RETRY_INTERVAL, bare(exc), database_waits + 1)
    return None if retry is None else replace(retry, database_waits=database_waits)


def render_once(
    part_id: int, *, task_id: str, retries: int, redelivered: bool, resumed: bool
) -> Retry | None:
    """One try of `render`; an unavailable database raises out of it."""
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
        if not (redelivered or retries or resumed):
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
    except DATABASE_UNAVAILABLE:
        raise
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
            return Retry(countdown=backoff(retries), error=bare(exc))
    except (PermanentImageError, StorageFailed) as exc:
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
    name = store(field, part, png)
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


def store(field: FileField, part: Part, png: bytes) -> str:
    """Save the PNG in the media storage; StorageFailed says in plain words why it could not."""
    try:
        return field.storage.save(
            field.generate_filename(part, f"part-{part.pk}-{secrets.token_hex(6)}.png"),
            ContentFile(png),
        )
    except OSError as exc:
        problem = STORAGE_PROBLEMS.get(exc.errno, "the media folder could not be written")
        log.error("image part %s: could not store its picture: %s", part.pk, exc)
        raise StorageFailed(
            f"the picture was drawn but could not be saved: {problem} ({exc.strerror}). "
            "Retry once it is fixed."
        ) from exc


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
