"""Images under faults, each test with workers (and sometimes a Redis) of its own.

Every worker here has settings of its own (failure injection, time limits, a private broker),
so none is shared; tests/media/test_worker.py has the healthy worker.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from chat.models import Part
from chat.states import message_status
from media.models import SweeperAction
from media.services import image_enqueue, image_retry, outbox
from tests.media.conftest import (
    FAILING,
    FINAL,
    IMAGES,
    STEP_DELAY,
    STEPS,
    expected_png,
    make_turn,
    stored_images,
    terminal_states,
    wait_image,
    wait_progress,
)
from tests.support.media import (
    EventTap,
    celery_broker,
    media_queue,
    new_redis_server,
    start_worker,
)
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_failures_are_retried_then_leave_a_partial_message(service_logs, media_root):
    worker = start_worker(
        service_logs,
        MEDIA_ROOT=str(media_root),
        TANDEM_IMAGE_STEPS="4",
        TANDEM_IMAGE_STEP_DELAY="0.05",
        **FAILING,
    )
    try:
        turn = make_turn()
        image_enqueue(turn.image)
        part = wait_image(turn, FINAL)
        assert part.state == Part.State.FAILED
        assert part.error == "Failed after 2 tries: injected failure (TANDEM_IMAGE_FAILURE_RATE=1)"
        assert worker.log_count(f"Task media.render_image[{part.task_id}] retry") == 1
        reply_states = list(turn.reply.parts.values_list("state", flat=True))
        assert message_status(reply_states) == "partial"
        assert Part.objects.get(pk=turn.text.pk).text == "Here it is."

        image_retry(part)  # the retry button: the same worker fails it again, as attempt 2
        wait_until(
            lambda: turn.refresh().attempt == 2 and turn.refresh().state in FINAL,
            30,
            "the retried image to finish",
        )
        assert turn.refresh().state == Part.State.FAILED
        assert stored_images(media_root, part) == []
    finally:
        worker.service.stop()


def test_the_soft_time_limit_fails_the_image_with_the_reason(service_logs, media_root):
    worker = start_worker(
        service_logs,
        MEDIA_ROOT=str(media_root),
        TANDEM_IMAGE_SOFT_TIME_LIMIT="1",
        TANDEM_IMAGE_TIME_LIMIT="5",
        **IMAGES,
    )
    try:
        turn = make_turn()
        image_enqueue(turn.image)
        part = wait_image(turn, FINAL)
        ran_for = (part.finished_at - part.started_at).total_seconds()
        assert 1 <= ran_for < STEPS * STEP_DELAY  # stopped at the limit, not finished
        assert (part.state, part.error) == (Part.State.FAILED, "Timed out after 1 s.")
        assert 0 < part.progress < 1 and stored_images(media_root, part) == []
        assert worker.service.alive()
    finally:
        worker.service.stop()


def test_images_in_flight_survive_sigkill_and_sigterm_of_the_worker(service_logs, media_root):
    """SIGKILL of the whole worker: its unacked message comes back after the visibility
    timeout (here hard limit 6 s + 1 s) to the next worker, which draws the image once.
    SIGTERM of the worker's main process (warm shutdown): the image in flight is finished
    before the worker exits."""
    redis_server = new_redis_server(service_logs).start()
    env = {
        "REDIS_URL": redis_server.url,
        "MEDIA_ROOT": str(media_root),
        "TANDEM_IMAGE_SOFT_TIME_LIMIT": "5",
        "TANDEM_IMAGE_TIME_LIMIT": "6",
        "TANDEM_VISIBILITY_MARGIN": "1",
        **IMAGES,
    }
    first = start_worker(service_logs, **env)
    replacement = None
    try:
        turn = make_turn()
        with EventTap(turn.conversation.pk, redis_server.url) as tap:
            with celery_broker(redis_server.url):
                image_enqueue(turn.image)
            wait_progress(turn)
            first.service.kill(signal.SIGKILL)
            interrupted = turn.refresh()
            replacement = start_worker(service_logs, **env)
            part = wait_image(turn, FINAL, timeout=60)
            states = tap.part_states(part.pk)
        assert interrupted.state == Part.State.RUNNING and interrupted.progress < 1
        assert part.state == Part.State.SUCCEEDED
        assert replacement.log_count(f"Task media.render_image[{part.task_id}] received") == 1
        assert terminal_states(states) == ["succeeded"]
        assert [stored.read_bytes() for stored in stored_images(media_root, part)] == [
            expected_png()
        ]

        second = make_turn()
        with celery_broker(redis_server.url):
            image_enqueue(second.image)
        wait_progress(second)
        os.kill(replacement.service.pid, signal.SIGTERM)
        wait_until(lambda: not replacement.service.alive(), 30, "the worker to exit")
        assert replacement.log_count("Warm shutdown") == 1
        assert second.refresh().state == Part.State.SUCCEEDED
    finally:
        for worker in (first, replacement):
            if worker is not None:
                worker.service.stop()
        redis_server.stop()


def test_after_an_outage_the_outbox_sends_what_could_not_be_sent_and_the_sweeper_what_was_lost(
    service_logs, media_root, tmp_path
):
    """Redis stops (losing a message already queued) and an image is enqueued meanwhile:
    enqueueing neither raises nor hangs; once Redis is back, this process's outbox sends the
    waiting image within a second, and beat's sweeper sends the lost one."""
    redis_server = new_redis_server(service_logs).start()
    worker = None
    try:
        lost, waiting = make_turn(), make_turn()
        with celery_broker(redis_server.url):
            image_enqueue(lost.image)
            redis_server.stop()
            started = time.monotonic()
            image_enqueue(waiting.image)
            assert time.monotonic() - started < 5
            assert {lost.refresh().state, waiting.refresh().state} == {Part.State.QUEUED}
            assert list(outbox.held()) == [waiting.image.pk]

            redis_server.start()
            wait_until(lambda: not outbox.held(), 10, "the outbox to send the waiting image")
        assert media_queue(redis_server.url) == [waiting.refresh().task_id]
        worker = start_worker(
            service_logs,
            beat_schedule=tmp_path / "beat-schedule",
            REDIS_URL=redis_server.url,
            MEDIA_ROOT=str(media_root),
            TANDEM_SWEEP_INTERVAL="1",
            TANDEM_QUEUED_STALE_AFTER="2",
            TANDEM_IMAGE_STEPS="4",
            TANDEM_IMAGE_STEP_DELAY="0.05",
        )
        for turn in (lost, waiting):
            assert wait_image(turn, FINAL).state == Part.State.SUCCEEDED
        requeued = SweeperAction.objects.filter(action=SweeperAction.Action.REQUEUED)
        assert lost.image.pk in set(requeued.values_list("part_id", flat=True))
    finally:
        if worker is not None:
            worker.service.stop()
        redis_server.stop()


def test_a_worker_reconnects_within_a_second_or_two_of_redis_returning(service_logs, media_root):
    """Kombu's own intervals (2, 4, 6 s …) would have the worker's next try 12 s after it lost
    Redis; media/consumer.py caps them at 1 s, so an image sent right after Redis returns
    (at 6.5 s) is drawn at once."""
    redis_server = new_redis_server(service_logs).start()
    env = {"REDIS_URL": redis_server.url, "MEDIA_ROOT": str(media_root)}
    worker = start_worker(service_logs, TANDEM_IMAGE_STEPS="2", TANDEM_IMAGE_STEP_DELAY="0", **env)
    try:
        turn = make_turn()
        with celery_broker(redis_server.url):
            redis_server.stop()
            wait_until(
                lambda: worker.log_count("Connection to broker lost") >= 1,
                10,
                "the worker to notice",
            )
            time.sleep(6.5)
            redis_server.start()
            back = time.monotonic()
            assert image_enqueue(turn.image) is True
            part = wait_image(turn, FINAL, timeout=30)
        assert part.state == Part.State.SUCCEEDED
        assert time.monotonic() - back < 4.0, worker.service.log_text()[-2000:]
    finally:
        worker.service.stop()
        redis_server.stop()
