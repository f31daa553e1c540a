"""The sweeper's three repairs, their records, and the admin that shows them."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from chat import heartbeat, live_text
from chat.models import Part
from media.models import SweeperAction
from media.sweeper import sweep
from tests.media.conftest import make_turn
from tests.media.test_services import queued_tasks

pytestmark = pytest.mark.django_db(transaction=True)


def ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def test_images_queued_too_long_are_sent_again(settings):
    settings.TANDEM_QUEUED_STALE_AFTER = 60
    stale, fresh = make_turn(), make_turn()
    Part.objects.filter(pk=stale.image.pk).update(queued_at=ago(120), task_id="lost")
    Part.objects.filter(pk=fresh.image.pk).update(queued_at=ago(10))

    [action] = sweep()

    assert (action.action, action.part_id) == (SweeperAction.Action.REQUEUED, stale.image.pk)
    assert "queued for 120 s" in action.detail
    resent = stale.refresh()
    assert resent.state == Part.State.QUEUED and resent.task_id != "lost"
    assert [task["id"] for task in queued_tasks()] == [resent.task_id]
    assert fresh.refresh().task_id == ""
    assert sweep() == []  # sending it again restarted its clock


def test_images_running_past_the_hard_limit_and_grace_fail(settings):
    settings.TANDEM_RUNNING_GRACE = 30
    limit = settings.CELERY_TASK_TIME_LIMIT + 30
    vanished, working = make_turn(), make_turn()
    Part.objects.filter(pk=vanished.image.pk).update(state="running", started_at=ago(limit + 1))
    Part.objects.filter(pk=working.image.pk).update(state="running", started_at=ago(limit - 5))

    [action] = sweep()

    assert (action.action, action.part_id) == (SweeperAction.Action.FAILED, vanished.image.pk)
    failed = vanished.refresh()
    assert failed.state == Part.State.FAILED
    assert (
        failed.error
        == f"The worker drawing this image stopped: no result {limit} s after it started."
    )
    assert working.refresh().state == Part.State.RUNNING


@pytest.fixture
def web_processes():
    """Two web-process owners in Redis: one beating, one whose heartbeat is gone."""
    alive, dead = "test-web-alive", "test-web-dead"
    heartbeat.beat(alive)
    yield alive, dead
    redis.Redis.from_url(settings.REDIS_URL).delete(heartbeat.KEY_PREFIX + alive)


def streaming_text(owner: str, quiet_for: float, saved: list[str], live: list[str]) -> Part:
    """A streaming text part: `saved` deltas in the database, `live` ones only in Redis."""
    part = make_turn(text_state=Part.State.STREAMING).text
    live_text.reset(part.pk)
    for delta in saved + live:
        live_text.append(part.pk, delta)
    Part.objects.filter(pk=part.pk).update(
        stream_owner=owner, text="".join(saved), seq=len(saved), updated_at=ago(quiet_for)
    )
    return part


def test_text_of_a_web_process_that_stopped_is_interrupted_keeping_its_text(web_processes):
    alive, dead = web_processes
    ttl = settings.TANDEM_HEARTBEAT_TTL
    orphan = streaming_text(dead, ttl + 5, ["Once", " upon"], [" a", " time"])
    healthy = streaming_text(alive, ttl + 5, ["Hello"], [])
    just_saved = streaming_text(dead, 1, ["Still"], [])

    [action] = sweep()

    assert (action.action, action.part_id) == (SweeperAction.Action.INTERRUPTED, orphan.pk)
    interrupted = Part.objects.get(pk=orphan.pk)
    assert interrupted.state == Part.State.INTERRUPTED
    assert (interrupted.text, interrupted.seq) == ("Once upon a time", 4)
    assert interrupted.error == "the web process streaming this reply stopped"
    assert interrupted.finished_at is not None
    assert Part.objects.get(pk=healthy.pk).state == Part.State.STREAMING
    assert Part.objects.get(pk=just_saved.pk).state == Part.State.STREAMING
    for part in (orphan, healthy, just_saved):
        live_text.expire(part.pk)


def test_the_admin_lists_sweeper_actions_and_retries_their_images(admin_client):
    turn = make_turn()
    Part.objects.filter(pk=turn.image.pk).update(state="running", started_at=ago(10_000))
    [action] = sweep()

    page = admin_client.get("/admin/media/sweeperaction/")
    assert page.status_code == 200
    assert "The worker drawing this image stopped" in page.content.decode()

    response = admin_client.post(
        "/admin/media/sweeperaction/",
        {"action": "retry_images", "_selected_action": [action.pk]},
        follow=True,
    )
    assert "1 image(s) queued again; 0 skipped" in response.content.decode()
    retried = turn.refresh()
    assert (retried.state, retried.attempt) == (Part.State.QUEUED, 2)
