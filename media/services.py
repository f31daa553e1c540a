"""The image part's life seen from outside the worker: enqueue, retry, cancel.

The chat (turn creation, the stop and retry buttons) and the admin call these; the worker's
side is `media/rendering.py`. Every state change goes through `chat.parts.part_transition`,
so the browser hears about it. The render task is published by name, so this module does
not import the tasks (which import the renderer and the sweeper, which import this).
"""

from __future__ import annotations

import logging
import threading
import uuid

import redis
from django.db import transaction
from django.utils import timezone

from chat.models import Part
from chat.parts import part_transition
from config.celery import app
from config.logging import bound
from media import metrics
from media.outbox import Outbox

log = logging.getLogger(__name__)

# Publishing happens while a web request waits: a short retry rides out a blip, and anything
# longer is left to the outbox, which sends the part again as soon as the broker answers.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
PING_TIMEOUT = 0.5


RENDER_TASK = "media.render_image"
_SENDING = threading.Lock()


def image_enqueue(part: Part) -> bool:
    """Publish a render task for a queued image part; True when the broker took it.

    The turn, a retry and the sweeper call it after their change commits, so the change
    stands whatever happens here: a broker outage never raises, the part stays `queued` and
    this process's outbox sends it as soon as the broker answers (the sweeper sends it later
    if this process dies first). The task id is recorded before publishing, so the row always
    names the latest message and a worker that starts at once finds it; it replaces the one
    the caller saw (`part.task_id`), so when two senders race (the outbox and the sweeper),
    one sends. A part that left `queued` is not sent. While the outbox holds parts, the broker
    was just found down: the part joins them without a try, so no request waits on it.
    """
    if outbox.held():
        outbox.hold(part.pk, part.task_id)
        return False
    task_id, sent = image_send(part.pk, part.task_id)
    if task_id and not sent:
        log.warning(
            "could not send image part %s to the queue; sending it when the broker answers",
            part.pk,
        )
        outbox.hold(part.pk, task_id)
    return sent


def image_send(part_id: int, seen_task_id: str) -> tuple[str, bool]:
    """Record a new task id in place of `seen_task_id` and publish it.

    Returns the new task id ("" when the row no longer named `seen_task_id` or was not a
    queued image: nothing sent) and whether the broker took the message.
    """
    task_id = str(uuid.uuid4())
    now = timezone.now()
    recorded = Part.objects.filter(
        pk=part_id, kind=Part.Kind.IMAGE, state=Part.State.QUEUED, task_id=seen_task_id
    ).update(task_id=task_id, queued_at=now, updated_at=now)
    if not recorded:
        return "", False
    try:
        with bound(part_id=part_id):  # sent with the task, so the worker's lines carry it
            send_render(part_id, task_id)
    except Exception:  # the broker is down or refused: the caller keeps the part for later
        log.info("image part %s not sent as task %s", part_id, task_id, exc_info=True)
        return task_id, False
    ids = {"part_id": part_id, "task_id": task_id}
    log.info("image part %s sent as task %s", part_id, task_id, extra=ids)
    return task_id, True


def send_render(part_id: int, task_id: str) -> None:
    """Publish the render task, one send at a time in this process.

    Request threads sending at once each took a broker connection from Celery's pool, which
    keeps every connection it opened: Redis connections that stepped up in a two-hour soak.
    A send is one LPUSH, so the others wait for it. (Not a pool limit: Celery's control
    commands take two connections from the pool at once and would deadlock at a limit.)
    """
    with _SENDING:
        # ignore_result: the outcome is on the row. Otherwise send_task first subscribes the
        # result backend to the task, and with Redis gone that retried 20 × 1 s in the request.
        app.send_task(
            RENDER_TASK,
            args=[part_id],
            task_id=task_id,
            retry_policy=PUBLISH_RETRY,
            ignore_result=True,
        )


def broker_answers() -> bool:
    """Whether the broker answers a PING now (a fresh connection, closed at once)."""
    try:
        with redis.Redis.from_url(
            app.conf.broker_url, socket_timeout=PING_TIMEOUT, socket_connect_timeout=PING_TIMEOUT
        ) as broker:
            return bool(broker.ping())
    except (redis.RedisError, OSError):
        return False


outbox = Outbox(send=image_send, broker_answers=broker_answers)


def image_retry(part: Part) -> Part | None:
    """Queue a failed or cancelled image again: attempt + 1, the reply's text untouched.

    Returns the queued part, or None when the part is not an image in a state that allows a
    retry. The old picture, if any, is deleted once the change is committed.
    """
    if part.kind != Part.Kind.IMAGE:
        return None
    current = Part.objects.filter(pk=part.pk).first()
    if current is None or current.state not in (Part.State.FAILED, Part.State.CANCELLED):
        return None  # a succeeded image goes back to the queue only by image_redraw
    old_image = current.image.name
    retried = part_transition(
        part.pk,
        Part.State.QUEUED,
        expect=current.state,
        attempt=current.attempt + 1,
        error="",
        progress=0.0,
        image="",
        task_id="",
        queued_at=timezone.now(),
        started_at=None,
        finished_at=None,
    )
    if retried is None:
        return None
    transaction.on_commit(lambda: metrics.image_retried("user"))
    if old_image:
        transaction.on_commit(lambda: retried.image.storage.delete(old_image))
    transaction.on_commit(lambda: image_enqueue(retried))
    return retried


def image_redraw(part: Part) -> Part | None:
    """ "New image" on a finished picture: a new attempt of the image part alone.

    The picture moves to `previous_image`, which the page keeps showing while the new one is
    drawn; the render's success replaces it (and deletes its file), a failure leaves it in
    place with the failure and Retry beside it. Returns None unless the part is a succeeded
    image.
    """
    if part.kind != Part.Kind.IMAGE:
        return None
    current = Part.objects.filter(pk=part.pk).first()
    if current is None or current.state != Part.State.SUCCEEDED or not current.image:
        return None
    queued = part_transition(
        part.pk,
        Part.State.QUEUED,
        expect=Part.State.SUCCEEDED,
        previous_image=current.image.name,
        image="",
        attempt=current.attempt + 1,
        error="",
        progress=0.0,
        task_id="",
        queued_at=timezone.now(),
        started_at=None,
        finished_at=None,
    )
    if queued is None:
        return None
    transaction.on_commit(lambda: image_enqueue(queued))
    return queued


def image_cancel(part: Part) -> Part | None:
    """Cancel a queued or running image; a worker drawing it stops at its next progress report.

    Returns the cancelled part, or None when it had already finished.
    """
    if part.kind != Part.Kind.IMAGE:
        return None
    return part_transition(part.pk, Part.State.CANCELLED, finished_at=timezone.now())
