"""The rendering service run in this process, on the real database and channel layer.

These cover the decisions (skip, restart, retry, fail, discard); tests/media/test_worker.py
runs the same service inside real worker processes.
"""

from __future__ import annotations

import errno
import gc
import uuid
import weakref

import pytest
from django.core.files.storage import FileSystemStorage
from django.db import OperationalError
from django.utils import timezone

from chat.models import Part
from media import rendering
from media.backends.base import TransientImageError, prompt_seed
from media.backends.procedural import ProceduralBackend
from media.services import image_cancel
from tests.media.conftest import PROMPT, make_turn, stored_images
from tests.support.media import EventTap

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit announcements run


@pytest.fixture(autouse=True)
def fast_images(settings):
    settings.TANDEM_IMAGE_STEPS = 4
    settings.TANDEM_IMAGE_STEP_DELAY = 0


def render(part: Part, retries: int = 0, redelivered: bool = False) -> rendering.Retry | None:
    task_id = part.task_id or f"test-{uuid.uuid4()}"
    return rendering.render(part.pk, task_id=task_id, retries=retries, redelivered=redelivered)


def test_a_render_stores_the_prompts_png_and_succeeds(media_root):
    turn = make_turn()
    with EventTap(turn.conversation.pk) as tap:
        assert render(turn.image) is None
        states = [event["state"] for event in tap.part_states(turn.image.pk)]
    part = turn.refresh()
    assert part.state == Part.State.SUCCEEDED and part.progress == 1.0
    assert part.started_at <= part.finished_at and part.error == ""
    [stored] = stored_images(media_root, part)
    assert part.image.name == stored.relative_to(media_root).as_posix()
    assert part.image.name.startswith(timezone.now().strftime("images/%Y/%m/part-"))
    expected = ProceduralBackend(4, 0).render(
        PROMPT, seed=prompt_seed(PROMPT), on_progress=lambda _: None
    )
    assert stored.read_bytes() == expected  # drawn from the user's words
    assert states[0] == "running" and states[-1] == "succeeded"


def test_a_final_part_is_left_alone(media_root):
    turn = make_turn()
    render(turn.image)
    before = turn.refresh()
    assert render(turn.image, redelivered=True) is None
    after = turn.refresh()
    assert (after.state, after.image.name, after.updated_at) == (
        before.state,
        before.image.name,
        before.updated_at,
    )
    assert len(stored_images(media_root, after)) == 1


def test_a_running_part_restarts_only_for_a_redelivery_or_a_retry(media_root):
    turn = make_turn()
    Part.objects.filter(pk=turn.image.pk).update(state=Part.State.RUNNING, progress=0.4)
    render(turn.image)  # a second copy of the message while another worker draws it
    assert turn.refresh().state == Part.State.RUNNING and turn.refresh().progress == 0.4
    render(turn.image, redelivered=True)  # the worker that had it died
    assert turn.refresh().state == Part.State.SUCCEEDED
    other = make_turn()
    Part.objects.filter(pk=other.image.pk).update(state=Part.State.RUNNING)
    render(other.image, retries=1)  # a Celery retry after a transient error
    assert other.refresh().state == Part.State.SUCCEEDED


def test_of_two_deliveries_that_both_saw_it_queued_only_one_draws(media_root, monkeypatch):
    """Both copies of a duplicated message read "queued" before either moved it to running.

    The interleaving cannot be timed for real, so the other delivery here takes the part
    between this delivery's read and its own move.
    """
    turn = make_turn()
    take = rendering.part_transition

    def other_delivery_first(part_id, target, **fields):
        take(part_id, Part.State.RUNNING, expect=Part.State.QUEUED, progress=0.3)
        return take(part_id, target, **fields)

    monkeypatch.setattr(rendering, "part_transition", other_delivery_first)
    assert render(turn.image) is None
    part = turn.refresh()
    assert (part.state, part.progress) == (Part.State.RUNNING, 0.3)  # the other one's render
    assert stored_images(media_root, part) == []


def test_transient_errors_retry_with_backoff_until_the_limit(media_root, settings):
    settings.TANDEM_IMAGE_FAILURE_RATE = 1.0
    settings.TANDEM_IMAGE_MAX_RETRIES = 2
    settings.TANDEM_IMAGE_RETRY_BACKOFF = 2.0
    settings.TANDEM_IMAGE_RETRY_BACKOFF_MAX = 5.0
    turn = make_turn()
    first = render(turn.image)
    assert 1.0 <= first.countdown <= 2.0
    assert "injected failure" in str(first.error)
    assert turn.refresh().state == Part.State.RUNNING  # still the worker's while it waits
    second = render(turn.image, retries=1)
    assert 2.0 <= second.countdown <= 4.0
    assert 2.5 <= rendering.backoff(5) <= 5.0  # capped
    assert render(turn.image, retries=2) is None
    part = turn.refresh()
    assert part.state == Part.State.FAILED
    assert part.error == "Failed after 3 tries: injected failure (TANDEM_IMAGE_FAILURE_RATE=1)"
    assert stored_images(media_root, part) == []


def test_a_retry_keeps_the_error_but_not_the_half_drawn_picture(media_root, monkeypatch):
    """Celery keeps the retry's error in a reference cycle until a full garbage collection;
    the error must not keep the render's frames, and their picture, alive meanwhile."""
    turn = make_turn()
    pictures: list[weakref.ref] = []

    class Picture:
        """Stands for the canvas a backend holds while it draws."""

    class FailsHalfway:
        def render(self, prompt, *, seed, on_progress):
            picture = Picture()
            pictures.append(weakref.ref(picture))
            try:
                raise OSError("the model server closed the connection")
            except OSError as cause:
                raise TransientImageError("the backend is unreachable") from cause

    monkeypatch.setattr(rendering, "configured_backend", FailsHalfway)
    gc.disable()  # only reference counting frees it, as between a busy worker's collections
    try:
        retry = render(turn.image)
        assert str(retry.error) == "the backend is unreachable"
        assert str(retry.error.__cause__) == "the model server closed the connection"
        assert pictures[0]() is None
    finally:
        gc.enable()


def test_a_permanent_error_fails_at_once_with_its_reason(media_root, settings, tmp_path):
    settings.TANDEM_IMAGE_BACKEND = "diffusers"
    settings.TANDEM_IMAGE_MODEL_DIR = str(tmp_path / "no-model")
    turn = make_turn()
    assert render(turn.image) is None
    part = turn.refresh()
    assert part.state == Part.State.FAILED
    assert part.error.startswith("Failed: no diffusers pipeline at TANDEM_IMAGE_MODEL_DIR=")


def test_a_crashing_backend_fails_the_part_instead_of_leaving_it_running(
    media_root, settings, tmp_path
):
    pytest.importorskip("diffusers", reason="the crash comes from diffusers reading a bad model")
    (tmp_path / "model_index.json").write_text("{not json")
    settings.TANDEM_IMAGE_BACKEND = "diffusers"
    settings.TANDEM_IMAGE_MODEL_DIR = str(tmp_path)
    turn = make_turn()
    render(turn.image)
    part = turn.refresh()
    assert part.state == Part.State.FAILED
    assert part.error.startswith("The image backend crashed (")


def test_a_render_that_loses_the_race_deletes_its_file(media_root, monkeypatch):
    """A cancel landing after the last progress report: the finished render is discarded.

    The race cannot be timed for real, so the backend here cancels the part itself, right
    before it returns its picture.
    """
    turn = make_turn()

    class CancelledAtTheLastMoment:
        def render(self, prompt, *, seed, on_progress):
            png = ProceduralBackend(2, 0).render(prompt, seed=seed, on_progress=on_progress)
            image_cancel(turn.image)
            return png

    monkeypatch.setattr(rendering, "configured_backend", CancelledAtTheLastMoment)
    render(turn.image)
    part = turn.refresh()
    assert part.state == Part.State.CANCELLED and not part.image
    assert list(media_root.rglob("*.png")) == []


def test_a_render_that_kills_its_worker_every_time_ends_failed(media_root, settings):
    """Redeliveries after a dead worker are counted; past the retry limit the part fails."""
    settings.TANDEM_IMAGE_MAX_RETRIES = 2
    turn = make_turn()
    task_id = f"test-{uuid.uuid4()}"
    Part.objects.filter(pk=turn.image.pk).update(state=Part.State.RUNNING, task_id=task_id)
    for _ in range(2):  # two earlier redeliveries, whose workers died too
        rendering.count_restart(task_id)
    render(turn.refresh(), redelivered=True)
    part = turn.refresh()
    assert part.state == Part.State.FAILED
    assert part.error == "Failed: the worker drawing this image died every time it tried."
    assert stored_images(media_root, part) == []


def test_a_database_outage_mid_render_waits_without_spending_retries(media_root, monkeypatch):
    turn = make_turn()
    down = OperationalError("connection refused (the gate is closed)")

    def unavailable(part, fraction):
        raise down

    monkeypatch.setattr(rendering, "part_progress", unavailable)
    waited = render(turn.image)
    assert waited.database_waits == 1 and waited.error is down
    assert waited.countdown == rendering.DATABASE_RETRY_INTERVAL
    assert turn.refresh().state == Part.State.RUNNING  # nothing can be recorded meanwhile
    again = rendering.render(
        turn.image.pk,
        task_id="t",
        retries=0,
        redelivered=False,
        database_waits=waited.database_waits,
    )
    assert again.database_waits == 2
    monkeypatch.undo()
    # The database is back: the same task (no render retry spent) draws it again and ends it.
    done = rendering.render(
        turn.image.pk, task_id="t", retries=0, redelivered=False, database_waits=2
    )
    assert done is None
    assert turn.refresh().state == Part.State.SUCCEEDED and turn.refresh().error == ""


def test_a_render_retry_after_database_waits_keeps_their_count(media_root, settings):
    settings.TANDEM_IMAGE_FAILURE_RATE = 1.0
    turn = make_turn()
    retry = rendering.render(
        turn.image.pk, task_id="t", retries=0, redelivered=False, database_waits=3
    )
    assert retry.database_waits == 3 and "injected failure" in str(retry.error)


def test_a_database_gone_for_longer_than_the_wait_is_left_to_the_sweeper(monkeypatch):
    def unavailable(*args, **kwargs):
        raise OperationalError("still down")

    monkeypatch.setattr(rendering, "render_once", unavailable)
    limit = int(rendering.DATABASE_WAIT / rendering.DATABASE_RETRY_INTERVAL)
    waited = rendering.render(
        1, task_id="t", retries=0, redelivered=False, database_waits=limit - 1
    )
    assert waited is not None and waited.database_waits == limit
    assert (
        rendering.render(1, task_id="t", retries=0, redelivered=False, database_waits=limit) is None
    )


def test_a_picture_that_cannot_be_stored_fails_with_the_reason_in_words(media_root, monkeypatch):
    """The storage refuses as an unwritable folder does (tests/chaos makes one for real)."""

    def refuse(storage, name, content):
        raise PermissionError(errno.EACCES, "Permission denied", str(media_root / name))

    monkeypatch.setattr(FileSystemStorage, "_save", refuse)
    turn = make_turn()
    assert render(turn.image) is None
    part = turn.refresh()
    assert part.state == Part.State.FAILED and not part.image
    assert part.error == (
        "Failed: the picture was drawn but could not be saved: the server may not write to its "
        "media folder (Permission denied). Retry once it is fixed."
    )
    assert Part.objects.get(pk=turn.text.pk).state == Part.State.SUCCEEDED  # the text stands
