"""Admin actions on work really in flight: a text streaming from the real engine in this
process, and an image being drawn by a real Celery worker."""

from __future__ import annotations

import pytest
from django.test import override_settings

from chat import live_text, services, text_stream
from chat.models import Part
from inference.engine import EngineEvent
from media.services import image_enqueue
from tests.admin.conftest import PARTS, post_action
from tests.media.conftest import (
    FINAL,
    IMAGES,
    finished_runs,
    make_turn,
    stored_images,
    wait_image,
    wait_progress,
)
from tests.support.media import EventTap, start_worker
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
STORY = "Write a long story about a dragon."
LONG = {"TANDEM_CHAT_TEMPERATURE": 0, "TANDEM_CHAT_MAX_NEW_TOKENS": 300}


def streaming_text(alice, conversation) -> Part:
    """A reply whose text is streaming in this process's engine, with some text shown."""
    part = services.turn_create(alice, conversation, STORY, False).parts.get()
    wait_until(lambda: len(live_text.tail(part.pk, 0)) >= 5, 60, "some text")
    return part


def stream_settled(engine, finished_before: int) -> None:
    """Wait until the engine has ended the reply and the stream writer has handled its end.

    The writer takes its queue one event at a time, in order: once a marker queued after the
    engine's last event has been taken, that event has been handled, state change and all.
    """
    wait_until(
        lambda: engine.stats().requests_finished > finished_before, 60, "the engine to finish"
    )
    marker = text_stream.writer.callback(Part(pk=0), 0)  # part 0: none
    marker(EngineEvent("marker", 0, None, ""))
    wait_until(text_stream.writer._queue.empty, 30, "the stream writer to catch up")


@pytest.mark.model
@override_settings(**LONG)
def test_mark_failed_on_a_streaming_text_stops_the_engine_and_keeps_the_text(
    admin_client, alice, conversation, engine_in_process
):
    before = engine_in_process.stats()
    part = streaming_text(alice, conversation)
    with EventTap(conversation.pk) as tap:
        assert post_action(admin_client, PARTS, "mark_failed", [part]) == {"1 marked failed"}
        failed = Part.objects.get(pk=part.pk)
        stream_settled(engine_in_process, before.requests_finished)
        states = [state["state"] for state in tap.part_states(part.pk)]
    assert failed.state == "failed" and failed.error == "Stopped by an operator."
    assert failed.text and failed.seq >= 5
    assert failed.text == "".join(live_text.tail(part.pk, 0)[: failed.seq])
    assert states == ["failed"]  # the engine's own "cancelled" end was refused
    assert engine_in_process.stats().tokens_generated - before.tokens_generated < 300
    assert Part.objects.get(pk=part.pk).state == "failed"


@pytest.mark.model
@override_settings(**LONG)
def test_cancel_generation_on_a_streaming_text_ends_it_cancelled_with_its_text(
    admin_client, alice, conversation, engine_in_process
):
    finished_before = engine_in_process.stats().requests_finished
    part = streaming_text(alice, conversation)
    with EventTap(conversation.pk) as tap:
        shown = post_action(admin_client, PARTS, "cancel_generation", [part])
        stream_settled(engine_in_process, finished_before)
        states = [state["state"] for state in tap.part_states(part.pk)]
    assert shown == {"1 stop sent to the engine (the text ends cancelled after its next step)"}
    final = Part.objects.get(pk=part.pk)
    assert (final.state, final.finish_reason) == ("cancelled", "cancelled")
    assert final.text and final.text == "".join(live_text.tail(part.pk, 0))
    assert final.completion_tokens < 300
    assert states[-1] == "cancelled"


def test_an_image_failed_mid_render_stays_failed_and_a_retry_draws_it(
    admin_client, media_root, service_logs
):
    worker = start_worker(service_logs, MEDIA_ROOT=str(media_root), **IMAGES)
    try:
        turn = make_turn()
        image_enqueue(turn.image)
        first_task = turn.refresh().task_id
        wait_progress(turn)
        assert post_action(admin_client, PARTS, "mark_failed", [turn.image]) == {"1 marked failed"}
        wait_until(lambda: finished_runs(worker, first_task) == 1, 30, "the render to stop")
        assert worker.log_count(f"stopped rendering image part {turn.image.pk}") == 1
        stopped = turn.refresh()
        assert stopped.state == "failed" and stopped.progress < 1
        assert stored_images(media_root, stopped) == []

        shown = post_action(admin_client, PARTS, "retry_image", [turn.image])
        assert shown == {"1 image(s) queued again"}
        drawn = wait_image(turn, FINAL)
        assert (drawn.state, drawn.attempt, drawn.error) == ("succeeded", 2, "")
        assert drawn.task_id != first_task and len(stored_images(media_root, drawn)) == 1
    finally:
        worker.service.stop()
