"""The image part's life seen from outside the worker: enqueue, retry, cancel.

The chat (turn creation, the stop and retry buttons) and the admin call these; the worker's
side is `media/rendering.py`. Every state change goes through `chat.services.part_transition`,
so the browser hears about it.
"""

from __future__ import annotations

import logging
import uuid

from django.db import transaction
from django.utils import timezone

from chat import metrics
from chat.models import Message, Part
from chat.services import part_transition
from config.logging import bound

log = logging.getLogger(__name__)

# Publishing happens while a web request waits: a short retry rides out a blip, and anything
# longer is left to the sweeper, which sends queued images again.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


def image_prompt(part: Part) -> str:
    """The image's prompt: the user's words, in the message just before the reply."""
    reply = part.message
    user_message = Message.objects.filter(
        conversation_id=reply.conversation_id, position=reply.position - 1
    ).first()
    return user_message.text if user_message else ""


def image_enqueue(part: Part) -> None:
    """Send the part's render task to the media queue; a broker outage never raises.

    Called after the turn's transaction commits, so the turn stands whatever happens here.
    The part stays `queued`; when the broker cannot be reached, the sweeper sends it later.
    """
    image_send(part.pk)


def image_send(part_id: int) -> bool:
    """Publish a render task for a queued image part; True when the broker took it.

    The task id is recorded before publishing, so the row always names the latest message
    and a worker that starts at once finds it. A part that left `queued` is not sent.
    """
    from media.tasks import render_image

    task_id = str(uuid.uuid4())
    now = timezone.now()
    recorded = Part.objects.filter(
        pk=part_id, kind=Part.Kind.IMAGE, state=Part.State.QUEUED
    ).update(task_id=task_id, queued_at=now, updated_at=now)
    if not recorded:
        return False
    try:
        with bound(part_id=part_id):  # sent with the task, so the worker's lines carry it
            render_image.apply_async(args=[part_id], task_id=task_id, retry_policy=PUBLISH_RETRY)
    except Exception:  # the broker is down or refused: the sweeper will send it again
        log.warning(
            "could not send image part %s to the queue; the sweeper will retry it",
            part_id,
            exc_info=True,
        )
        return False
    ids = {"part_id": part_id, "task_id": task_id}
    log.info("image part %s sent as task %s", part_id, task_id, extra=ids)
    return True


def image_retry(part: Part) -> Part | None:
    """Queue a failed or cancelled image again: attempt + 1, the reply's text untouched.

    Returns the queued part, or None when the part is not an image in a state that allows a
    retry. The old picture, if any, is deleted once the change is committed.
    """
    if part.kind != Part.Kind.IMAGE:
        return None
    current = Part.objects.filter(pk=part.pk).first()
    if current is None:
        return None
    old_image = current.image.name
    retried = part_transition(
        part.pk,
        Part.State.QUEUED,
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


def image_cancel(part: Part) -> Part | None:
    """Cancel a queued or running image; a worker drawing it stops at its next progress report.

    Returns the cancelled part, or None when it had already finished.
    """
    if part.kind != Part.Kind.IMAGE:
        return None
    return part_transition(part.pk, Part.State.CANCELLED, finished_at=timezone.now())
