"""Images drawn by one real Celery worker process over the real Redis, shared by the tests
that leave it healthy: success, duplicates, cancel, and a pool process killed mid-render.

No eager mode anywhere: tasks travel through the broker to a `celery worker` started here.
tests/media/test_worker_faults.py has the faults that need workers of their own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from chat.models import Part
from chat.states import message_status
from media.rendering import PROGRESS_INTERVAL
from media.services import image_cancel, image_enqueue
from media.tasks import render_image
from tests.media.conftest import (
    FINAL,
    IMAGES,
    expected_png,
    finished_runs,
    make_turn,
    stored_images,
    terminal_states,
    wait_image,
    wait_progress,
)
from tests.support.media import EventTap, Worker, start_worker
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def shared_media_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="module")
def render_worker(django_db_setup, service_logs, shared_media_root) -> Iterator[Worker]:
    """One worker with two pool processes, shared by the tests that leave it healthy."""
    worker = start_worker(service_logs, concurrency=2, MEDIA_ROOT=str(shared_media_root), **IMAGES)
    yield worker
    worker.service.stop()


@pytest.fixture
def media_dir(shared_media_root, settings) -> Path:
    settings.MEDIA_ROOT = shared_media_root
    return shared_media_root


def test_an_image_is_drawn_with_throttled_progress_and_stored(render_worker, media_dir):
    turn = make_turn()
    with EventTap(turn.conversation.pk) as tap:
        image_enqueue(turn.image)
        part = wait_image(turn, FINAL)
        states = tap.part_states(part.pk)
    assert part.state == Part.State.SUCCEEDED and part.progress == 1.0
    [stored] = stored_images(media_dir, part)
    assert stored.read_bytes() == expected_png()
    assert part.image.name == stored.relative_to(media_dir).as_posix()
    # Progress reaches the browser while it draws, but at most every 0.5 s, not every step.
    pushed = [state["progress"] for state in states if 0 < state["progress"] < 1]
    ran_for = (part.finished_at - part.started_at).total_seconds()
    assert 2 <= len(pushed) <= ran_for / PROGRESS_INTERVAL + 1  # 11 if every step went
    assert pushed == sorted(pushed)
    assert terminal_states(states) == ["succeeded"]
    assert states[-1]["image_url"] == part.image.url
    reply_states = list(turn.reply.parts.values_list("state", flat=True))
    assert message_status(reply_states) == "complete"


def test_duplicate_deliveries_give_one_file_and_one_state_change(render_worker, media_dir):
    turn = make_turn()
    with EventTap(turn.conversation.pk) as tap:
        image_enqueue(turn.image)
        task_id = turn.refresh().task_id
        render_image.apply_async(args=[turn.image.pk], task_id=task_id)  # the same, at once
        wait_until(lambda: finished_runs(render_worker, task_id) == 2, 30, "both deliveries")
        done = turn.refresh()
        render_image.apply_async(args=[turn.image.pk], task_id=task_id)  # and once it is done
        wait_until(lambda: finished_runs(render_worker, task_id) == 3, 30, "the third delivery")
        states = tap.part_states(turn.image.pk)
    assert render_worker.log_count(f"task {task_id}: image part {turn.image.pk} is already") == 2
    assert done.state == Part.State.SUCCEEDED
    assert turn.refresh().updated_at == done.updated_at
    assert len(stored_images(media_dir, done)) == 1
    assert terminal_states(states) == ["succeeded"]
    running = [state["progress"] for state in states if state["state"] == "running"]
    assert running == sorted(running)  # never restarted from zero by the duplicate


def test_cancelling_stops_a_render_in_progress(render_worker, media_dir):
    turn = make_turn()
    image_enqueue(turn.image)
    task_id = turn.refresh().task_id
    wait_progress(turn)
    image_cancel(turn.image)
    wait_until(lambda: finished_runs(render_worker, task_id) == 1, 30, "the task to return")
    part = turn.refresh()
    assert part.state == Part.State.CANCELLED and part.progress < 1
    assert render_worker.log_count(f"stopped rendering image part {part.pk}") == 1
    assert stored_images(media_dir, part) == []


def test_a_pool_process_killed_mid_render_is_redelivered_and_ends_once(render_worker, media_dir):
    """SIGKILL of the process drawing the image (what the OOM killer does)."""
    from config.celery import app

    turn = make_turn()
    with EventTap(turn.conversation.pk) as tap:
        image_enqueue(turn.image)
        task_id = turn.refresh().task_id
        wait_progress(turn)
        active = app.control.inspect([render_worker.name], timeout=5).active()
        [pid] = [task["worker_pid"] for task in active[render_worker.name] if task["id"] == task_id]
        os.kill(pid, signal.SIGKILL)
        part = wait_image(turn, FINAL)
        states = tap.part_states(part.pk)
    assert part.state == Part.State.SUCCEEDED
    assert render_worker.log_count(f"Task media.render_image[{task_id}] received") == 2
    assert render_worker.log_count("WorkerLostError") >= 1
    assert terminal_states(states) == ["succeeded"]
    assert [stored.read_bytes() for stored in stored_images(media_dir, part)] == [expected_png()]
