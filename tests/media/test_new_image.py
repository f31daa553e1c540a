""" "New image" on a finished picture: a new attempt of the image part alone, drawn by a real
worker; the old picture kept until the new one succeeds, and kept if it fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.files.base import ContentFile

from chat.models import Part
from chat.states import message_status
from media import rendering
from media.services import image_cancel, image_enqueue, image_redraw, image_retry
from tests.media.conftest import IMAGES, make_turn, wait_image
from tests.support.media import EventTap, Worker, start_worker
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker_and_media(service_logs, tmp_path, settings) -> Iterator[tuple[Worker, Path]]:
    settings.MEDIA_ROOT = tmp_path
    worker = start_worker(service_logs, MEDIA_ROOT=str(tmp_path), **IMAGES)
    yield worker, tmp_path
    worker.service.stop()


def statuses(part: Part) -> str:
    return message_status(
        list(Part.objects.filter(message=part.message).values_list("state", flat=True))
    )


def test_the_old_picture_stays_until_the_new_one_is_drawn(worker_and_media):
    _, media = worker_and_media
    turn = make_turn()
    image_enqueue(turn.image)
    first = wait_image(turn, {"succeeded"}).image.name
    assert (media / first).exists()
    assert image_redraw(turn.text) is None  # a text part has no picture to draw again

    with EventTap(turn.conversation.pk) as tap:
        queued = image_redraw(turn.refresh())
        assert (queued.state, queued.previous_image.name, queued.image.name) == (
            "queued",
            first,
            "",
        )
        assert queued.attempt == 2
        done = wait_image(turn, {"succeeded", "failed"})
        shown = tap.part_states(turn.image.pk)
    assert done.state == "succeeded" and done.image.name != first
    assert done.previous_image.name == ""
    # The worker deletes the replaced picture just after the state it saved: wait for it.
    wait_until(lambda: not (media / first).exists(), 10, "the replaced picture to go")
    assert (media / done.image.name).exists()
    # While the new one was drawn, every state the page saw still named the old picture.
    drawing = [s for s in shown if s["state"] in ("queued", "running")]
    assert drawing and all(s["previous_image_url"].endswith(first) for s in drawing)
    assert shown[-1]["previous_image_url"] is None
    assert statuses(done) == "complete"


def test_a_failed_new_attempt_keeps_the_old_picture_and_can_be_retried(tmp_path, settings):
    settings.MEDIA_ROOT = tmp_path
    turn = make_turn()
    picture = turn.image
    picture.image.save("old.png", ContentFile(b"\x89PNG old"), save=False)
    Part.objects.filter(pk=picture.pk).update(state="succeeded", image=picture.image.name)
    old = picture.image.name
    queued = image_redraw(turn.refresh())
    # The fault, as the worker reports it after its last try (no worker consumes here).
    rendering.fail(queued.pk, "Failed after 2 tries: the backend broke")
    failed = turn.refresh()
    assert (failed.state, failed.previous_image.name, failed.image.name) == ("failed", old, "")
    assert (tmp_path / old).exists()
    assert statuses(failed) == "partial"  # the new attempt failed; the text stands
    retried = image_retry(failed)
    assert (retried.state, retried.attempt, retried.previous_image.name) == ("queued", 3, old)
    image_cancel(retried)
    assert (tmp_path / old).exists()
