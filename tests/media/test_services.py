"""Enqueue, retry and cancel, against the real database and the real Redis broker."""

from __future__ import annotations

import json
import time

import pytest
import redis
from django.conf import settings
from django.core.files.base import ContentFile
from django.utils import timezone

from chat.models import Part
from config.celery import app
from media.services import image_cancel, image_enqueue, image_retry, outbox
from tests.media.conftest import make_turn
from tests.support.media import celery_broker
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def queued_tasks() -> list[dict]:
    """Headers of the messages waiting in the broker's media queue."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    return [json.loads(raw)["headers"] for raw in client.lrange("media", 0, -1)]


def test_enqueue_publishes_a_render_task_and_records_it():
    turn = make_turn()
    before = timezone.now()
    image_enqueue(turn.image)
    part = turn.refresh()
    assert part.state == Part.State.QUEUED and part.queued_at >= before
    [task] = queued_tasks()
    assert (task["id"], task["task"], task["argsrepr"]) == (
        part.task_id,
        "media.render_image",
        f"[{part.pk}]",
    )


def test_enqueue_with_the_broker_down_leaves_the_part_queued_and_returns():
    turn = make_turn()
    started = time.monotonic()
    with celery_broker(f"redis://127.0.0.1:{free_port()}/0"):
        image_enqueue(turn.image)  # must not raise
        assert time.monotonic() - started < 5
        assert list(outbox.held()) == [turn.image.pk]  # sent once the broker answers
    assert turn.refresh().state == Part.State.QUEUED


def test_retry_queues_a_failed_image_again_and_leaves_the_text(media_root):
    turn = make_turn()
    Part.objects.filter(pk=turn.image.pk).update(
        state=Part.State.FAILED,
        error="Failed: boom",
        progress=0.5,
        task_id="old",
        finished_at=timezone.now(),
    )
    failed = turn.refresh()
    failed.image.save("old.png", ContentFile(b"png"))
    old_file = media_root / failed.image.name

    retried = image_retry(failed)

    part = turn.refresh()
    assert retried is not None and part.state == Part.State.QUEUED
    assert (part.attempt, part.error, part.progress, part.image.name) == (2, "", 0.0, "")
    assert part.finished_at is None and not old_file.exists()
    assert [task["id"] for task in queued_tasks()] == [part.task_id] != ["old"]
    text = Part.objects.get(pk=turn.text.pk)
    assert (text.state, text.text, text.attempt) == (Part.State.SUCCEEDED, "Here it is.", 1)


@pytest.mark.parametrize("state", [Part.State.QUEUED, Part.State.RUNNING, Part.State.SUCCEEDED])
def test_retry_refuses_images_that_did_not_fail(state):
    turn = make_turn()
    Part.objects.filter(pk=turn.image.pk).update(state=state)
    assert image_retry(turn.refresh()) is None
    assert turn.refresh().attempt == 1 and queued_tasks() == []


def test_retry_refuses_text_and_takes_cancelled_images():
    turn = make_turn(text_state=Part.State.FAILED)
    assert image_retry(turn.text) is None
    assert image_cancel(turn.image) is not None
    assert image_retry(turn.refresh()).state == Part.State.QUEUED


def test_cancel_stops_queued_and_running_images_but_not_finished_ones():
    turn = make_turn()
    cancelled = image_cancel(turn.image)
    assert cancelled.state == Part.State.CANCELLED and cancelled.finished_at is not None
    assert image_cancel(turn.refresh()) is None
    running = make_turn()
    Part.objects.filter(pk=running.image.pk).update(state=Part.State.RUNNING)
    assert image_cancel(running.image).state == Part.State.CANCELLED
    done = make_turn()
    Part.objects.filter(pk=done.image.pk).update(state=Part.State.SUCCEEDED)
    assert image_cancel(done.image) is None
    assert image_cancel(done.text) is None


def test_enqueue_does_not_subscribe_to_a_result_nobody_reads(monkeypatch):
    """send_task subscribes the Redis result backend to the task's result unless told to
    ignore it; with Redis gone, that subscription retries 20 times 1 s apart inside the
    request (a turn took 19.5 s in the outage scenario, holding the turn admission lock)."""
    subscribed = []
    monkeypatch.setattr(app.backend, "on_task_call", lambda _, task_id: subscribed.append(task_id))
    turn = make_turn()
    assert image_enqueue(turn.image) is True
    assert subscribed == []
