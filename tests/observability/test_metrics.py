"""The chat and media counters on /metrics: fed by the services in any process, kept in Redis.

Counters are shared by every test on the Redis database, so each test compares a scrape
after its events with one before them.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from chat import metrics
from chat.metrics import IMAGE_SECONDS_BUCKETS
from chat.models import Conversation, Part
from chat.parts import part_transition
from media import metrics as media_metrics
from media.rendering import render
from media.services import image_enqueue, image_retry
from media.sweeper import sweep
from tests.media.conftest import FAILING, FINAL, IMAGES, finished_runs, make_turn, wait_image
from tests.support.media import start_worker
from tests.support.processes import free_port, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PARTS = "tandem_chat_parts_finished_total"
TURNS = "tandem_chat_turns_total"
RETRIES = "tandem_media_image_retries_total"
SWEEPS = "tandem_media_sweeper_actions_total"
DURATION = "tandem_media_image_duration_seconds"


def parts(kind: str, state: str) -> str:
    return f'{PARTS}{{kind="{kind}",state="{state}"}}'


def bucket(state: str, le: str) -> str:
    return f'{DURATION}_bucket{{le="{le}",state="{state}"}}'


def changes(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The samples that moved, by how much."""
    return {
        name: after[name] - before.get(name, 0)
        for name in after
        if after[name] != before.get(name, 0)
    }


def settled(read, before: dict[str, float], expected: dict[str, float]) -> dict[str, float]:
    """The changes once they match `expected`: counters move just after the state commits."""
    wait_until(lambda: changes(before, read()) == expected, 10, f"the counters to move: {expected}")
    return changes(before, read())


def buckets_of(samples: dict[str, float], state: str) -> list[tuple[str, float]]:
    """One state's histogram buckets, in the order of their bounds."""
    bounds = [str(bound) for bound in IMAGE_SECONDS_BUCKETS] + ["+Inf"]
    return [(le, samples[bucket(state, le)]) for le in bounds]


def test_a_finished_image_is_counted_timed_and_kept_when_its_conversation_goes(scrape):
    turn = make_turn()
    started = timezone.now() - timedelta(seconds=3.2)
    before_parts, before_seconds = scrape(PARTS), scrape(DURATION)

    part_transition(turn.image.pk, Part.State.RUNNING, started_at=started)
    part_transition(turn.image.pk, Part.State.SUCCEEDED, finished_at=timezone.now())

    after_seconds = scrape(DURATION)
    assert changes(before_parts, scrape(PARTS)) == {parts("image", "succeeded"): 1}
    moved = changes(before_seconds, after_seconds)
    # 3.2 s lies above 2.5 and at or below 5: every bucket from le=5 up counts it, none below.
    assert {name for name in moved if "_bucket" in name} == {
        bucket("succeeded", le) for le in ["5.0", "10.0", "20.0", "30.0", "60.0", "90.0"]
    } | {bucket("succeeded", le) for le in ["120.0", "300.0", "+Inf"]}
    assert moved[f'{DURATION}_count{{state="succeeded"}}'] == 1
    assert 3.2 <= moved[f'{DURATION}_sum{{state="succeeded"}}'] < 5

    seen = scrape(PARTS) | scrape(DURATION)
    Conversation.objects.filter(pk=turn.conversation.pk).delete()
    assert scrape(PARTS) | scrape(DURATION) == seen  # counters, not row counts: they stay


def test_histogram_buckets_are_cumulative_and_end_at_the_count(scrape):
    for seconds in (0.2, 0.7, 4.0, 400.0):
        turn = make_turn()
        started = timezone.now() - timedelta(seconds=seconds)
        part_transition(turn.image.pk, Part.State.RUNNING, started_at=started)
        part_transition(turn.image.pk, Part.State.FAILED, error="test", finished_at=timezone.now())
    samples = scrape(DURATION)
    for state in metrics.final_states(Part.Kind.IMAGE):
        counts = [count for _, count in buckets_of(samples, state)]
        assert counts == sorted(counts)
        assert counts[-1] == samples[f'{DURATION}_count{{state="{state}"}}']
    failed = dict(buckets_of(samples, "failed"))
    assert failed["+Inf"] - failed["300.0"] >= 1  # the 400 s one is only in +Inf
    assert failed["0.5"] >= 1 and failed["1.0"] - failed["0.5"] >= 1


def test_every_final_state_of_the_state_machines_is_exposed_from_zero(scrape):
    samples = scrape(PARTS)
    assert set(samples) == {
        parts("text", state) for state in ("cancelled", "failed", "interrupted", "succeeded")
    } | {parts("image", state) for state in ("cancelled", "failed", "succeeded")}
    assert set(scrape(SWEEPS)) == {
        f'{SWEEPS}{{action="{action}"}}' for action in ("requeued", "failed", "interrupted")
    }


def test_sweeper_repairs_are_counted(scrape, settings):
    settings.TANDEM_QUEUED_STALE_AFTER = 60
    settings.TANDEM_RUNNING_GRACE = 30
    stale, vanished = make_turn(), make_turn()
    long_ago = timezone.now() - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT + 60)
    Part.objects.filter(pk=stale.image.pk).update(queued_at=long_ago)
    Part.objects.filter(pk=vanished.image.pk).update(state="running", started_at=long_ago)
    before = scrape(SWEEPS) | scrape(PARTS)

    actions = sweep()

    assert sorted(action.action for action in actions) == ["failed", "requeued"]
    assert changes(before, scrape(SWEEPS) | scrape(PARTS)) == {
        f'{SWEEPS}{{action="requeued"}}': 1,
        f'{SWEEPS}{{action="failed"}}': 1,
        parts("image", "failed"): 1,
    }


def test_a_render_restarted_after_its_worker_died_counts_as_redelivered(
    media_root, scrape, settings
):
    """The broker's redelivery flag, as a worker sees it after a pool process was killed
    (tests/media/test_worker.py causes that for real); here the render runs in this process."""
    settings.TANDEM_IMAGE_STEPS, settings.TANDEM_IMAGE_STEP_DELAY = 2, 0
    turn = make_turn()
    part_transition(turn.image.pk, Part.State.RUNNING, started_at=timezone.now())
    before = scrape(RETRIES) | scrape(PARTS)

    render(turn.image.pk, task_id=f"test-{uuid.uuid4()}", retries=0, redelivered=True)

    assert turn.refresh().state == Part.State.SUCCEEDED
    assert changes(before, scrape(RETRIES) | scrape(PARTS)) == {
        f'{RETRIES}{{reason="redelivered"}}': 1,
        parts("image", "succeeded"): 1,
    }
    before = scrape(RETRIES)
    render(turn.image.pk, task_id=f"test-{uuid.uuid4()}", retries=0, redelivered=True)
    assert scrape(RETRIES) == before  # a redelivery of a finished image starts nothing


def test_without_redis_nothing_is_counted_and_nothing_breaks(client, scrape):
    """Redis refusing connections (a free port): events are dropped, /metrics still answers."""
    before = scrape(TURNS)
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"):
        metrics.turn_created(wants_image=False)
        media_metrics.sweeper_action("requeued")
        response = client.get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    assert "tandem_engine_running_requests" in text and "tandem_chat_" not in text
    assert scrape(TURNS) == before


@pytest.mark.model
@override_settings(TANDEM_CHAT_TEMPERATURE=0, TANDEM_CHAT_MAX_NEW_TOKENS=12)
def test_turns_and_their_text_parts_after_real_turns(
    client, alice, conversation, engine_in_process, scrape
):
    client.force_login(alice)
    before = scrape(TURNS) | scrape(PARTS)

    response = client.post(
        f"/c/{conversation.pk}/turns",
        json.dumps({"text": "Name a colour.", "image": False}),
        content_type="application/json",
    )
    assert response.status_code == 201
    text_part = Part.objects.get(pk=response.json()["reply"]["parts"][0]["id"])
    wait_until(lambda: Part.objects.get(pk=text_part.pk).state in FINAL, 120, "the reply's text")

    expected = {f'{TURNS}{{image="false"}}': 1, parts("text", "succeeded"): 1}
    assert settled(lambda: scrape(TURNS) | scrape(PARTS), before, expected) == expected


def test_image_outcomes_from_real_workers(service_logs, media_root, scrape):
    """A worker that draws, then one whose renders always fail: retried, failed, retried by
    the user. Every count comes from the worker processes, through Redis, to this /metrics."""
    before = scrape(PARTS) | scrape(RETRIES) | scrape(DURATION)
    drawing = start_worker(service_logs, MEDIA_ROOT=str(media_root), **IMAGES)
    try:
        drawn = make_turn()
        image_enqueue(drawn.image)
        task_id = drawn.refresh().task_id
        wait_until(lambda: finished_runs(drawing, task_id) == 1, 60, "the render to return")
        succeeded = drawn.refresh()
    finally:
        drawing.service.stop()
    assert succeeded.state == Part.State.SUCCEEDED
    failing = start_worker(service_logs, MEDIA_ROOT=str(media_root), **FAILING, **IMAGES)
    try:
        broken = make_turn()
        image_enqueue(broken.image)
        failed = wait_image(broken, FINAL)
        assert failed.state == Part.State.FAILED and "after 2 tries" in failed.error
        assert image_retry(failed) is not None
        again = wait_image(broken, {Part.State.FAILED}, timeout=60)
        wait_until(
            lambda: finished_runs(failing, again.task_id) == 1, 30, "the retry's task to return"
        )
    finally:
        failing.service.stop()

    moved = changes(before, scrape(PARTS) | scrape(RETRIES) | scrape(DURATION))
    assert moved[parts("image", "succeeded")] == 1
    assert moved[parts("image", "failed")] == 2  # the first ending and the retry's
    assert moved[f'{RETRIES}{{reason="transient"}}'] == 2  # one Celery retry per attempt
    assert moved[f'{RETRIES}{{reason="user"}}'] == 1
    assert moved[f'{DURATION}_count{{state="succeeded"}}'] == 1
    assert moved[f'{DURATION}_count{{state="failed"}}'] == 2
    ran = (succeeded.finished_at - succeeded.started_at).total_seconds()
    slowest = (again.finished_at - again.started_at).total_seconds()
    assert moved[f'{DURATION}_sum{{state="succeeded"}}'] == pytest.approx(ran, abs=1e-3)
    assert moved[f'{DURATION}_sum{{state="failed"}}'] >= slowest
