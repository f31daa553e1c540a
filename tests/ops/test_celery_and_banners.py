"""The ops page against a real broker and real workers: workers up, workers down, Redis
unreachable, the model not ready. Each state must show a clear banner, never hang the page."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from chat.models import Part
from config.celery import app
from inference.provisioning.runtime import model_runtime
from media.models import SweeperAction
from media.services import image_enqueue
from tests.media.conftest import make_turn
from tests.ops.conftest import banner_components, feed
from tests.support.media import celery_broker, start_worker
from tests.support.processes import free_port, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# 32 steps of 0.25 s: a render stays active for seconds while the page looks at it.
SLOW_IMAGES = {"TANDEM_IMAGE_STEPS": "32", "TANDEM_IMAGE_STEP_DELAY": "0.25"}


@pytest.fixture(autouse=True)
def empty_queue() -> Iterator[None]:
    app.control.purge()
    yield
    app.control.purge()


@pytest.fixture
def patient_probes(settings):
    """A loaded 2-core machine may take more than the default second to answer a ping."""
    settings.TANDEM_HEALTH_TIMEOUT = 3.0


def test_without_workers_images_wait_in_the_queue_and_a_banner_says_so(staff_client):
    turns = [make_turn() for _ in range(3)]
    for turn in turns:
        image_enqueue(turn.image)
    failed = make_turn().image
    Part.objects.filter(pk=failed.pk).update(state=Part.State.FAILED, error="Backend exploded.")
    SweeperAction.objects.create(
        action=SweeperAction.Action.REQUEUED, part=turns[0].image, detail="queued for 61 s"
    )
    snapshot = feed(staff_client)
    assert snapshot["redis"]["state"] == "ok" and snapshot["celery"]["state"] == "ok"
    assert snapshot["celery"]["workers"] == [] and snapshot["celery"]["queue_depth"] == 3
    assert banner_components(snapshot) >= {"workers"} and "redis" not in banner_components(snapshot)
    [image_failure] = snapshot["failures"]["images"]
    assert image_failure["part"] == failed.pk and image_failure["error"] == "Backend exploded."
    assert snapshot["failures"]["sweeper"][0]["detail"] == "queued for 61 s"
    html = staff_client.get("/ops/").content.decode()
    assert 'role="alert" data-component="workers">No Celery workers online' in html
    assert "Backend exploded." in html and "queued for 61 s" in html
    assert '<span data-field="celery.queue_depth">3</span>' in html


def test_a_running_worker_is_found_with_its_active_and_reserved_tasks(
    staff_client, service_logs, tmp_path, patient_probes
):
    worker = start_worker(service_logs, MEDIA_ROOT=str(tmp_path), **SLOW_IMAGES)
    try:
        turns = [make_turn() for _ in range(3)]
        for turn in turns:
            image_enqueue(turn.image)
        wait_until(lambda: turns[0].refresh().state == Part.State.RUNNING, 60, "the first render")
        snapshot = feed(staff_client)
        html = staff_client.get("/ops/").content.decode()
    finally:
        worker.service.stop(timeout=30)
    celery = snapshot["celery"]
    assert celery["workers"] == [worker.name]
    assert "workers" not in banner_components(snapshot)
    [active] = celery["active"]
    assert active["name"] == "media.render_image" and active["worker"] == worker.name
    assert active["args"] == [turns[0].image.pk] and active["id"] == turns[0].refresh().task_id
    # One worker with one pool process prefetches one more; the third waits in Redis.
    waiting = [task["args"] for task in celery["reserved"]]
    assert len(waiting) + celery["queue_depth"] == 2
    assert all(args in ([turns[1].image.pk], [turns[2].image.pk]) for args in waiting)
    assert f"<code>{worker.name}</code>" in html and 'data-kind="active"' in html


def test_an_unreachable_redis_shows_banners_and_the_page_still_renders(staff_client, settings):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_URL = dead
    with celery_broker(dead):
        started = time.monotonic()
        snapshot = feed(staff_client)
        page = staff_client.get("/ops/")
        elapsed = time.monotonic() - started
    assert elapsed < 10, "a dead broker must fail fast, not hang the page"
    assert snapshot["redis"]["state"] == "error" and "Connection" in snapshot["redis"]["error"]
    assert snapshot["celery"]["state"] == "error" and snapshot["celery"]["queue_depth"] is None
    assert banner_components(snapshot) >= {"redis", "workers"}
    html = page.content.decode()
    assert page.status_code == 200
    assert 'role="alert" data-component="redis">Redis is unreachable' in html
    assert "No Celery workers online (Redis is down)" in html


@pytest.mark.parametrize(
    ("state", "error", "level", "words"),
    [
        ("loading", "", "warning", "The model is still loading"),
        ("error", "No such model: nope", "error", "The model failed to load: No such model: nope"),
        ("disabled", "", "error", "The model is disabled"),
    ],
)
def test_a_model_that_is_not_ready_gets_a_banner(
    staff_client, monkeypatch, state, error, level, words
):
    monkeypatch.setattr(model_runtime, "state", state)
    monkeypatch.setattr(model_runtime, "error", error)
    snapshot = feed(staff_client)
    [banner] = [b for b in snapshot["banners"] if b["component"] == "model"]
    assert banner["level"] == level and banner["text"].startswith(words)
    assert snapshot["engine"]["state"] == state and snapshot["engine"]["stats"] is None
    html = staff_client.get("/ops/").content.decode()
    assert f'class="ops-banner ops-banner-{level}" role="alert" data-component="model"' in html


def test_a_ready_model_has_no_banner(staff_client, monkeypatch):
    monkeypatch.setattr(model_runtime, "state", "ready")
    assert "model" not in banner_components(feed(staff_client))


def test_remote_engines_are_shown_each_with_its_state_and_a_banner_when_down(
    staff_client, client, monkeypatch
):
    from inference.provisioning.remote_engine import RemoteEngine

    dead = f"http://127.0.0.1:{free_port()}"
    remote = RemoteEngine([dead])
    monkeypatch.setattr(model_runtime, "state", "remote")
    monkeypatch.setattr(model_runtime, "remote", remote)
    try:
        check_remote_engine_is_shown(staff_client, client, dead)
    finally:
        remote.close()


def check_remote_engine_is_shown(staff_client, client, dead: str) -> None:
    snapshot = feed(staff_client)
    [engine] = snapshot["engine"]["engines"]
    assert engine["url"] == dead and engine["reachable"] is False
    assert "ConnectError" in engine["last_error"]
    [banner] = [b for b in snapshot["banners"] if b["component"] == "model"]
    assert banner["text"].startswith(f"The engine at {dead} is unreachable (ConnectError")
    html = staff_client.get("/ops/").content.decode()
    assert f"<code>{dead}</code>" in html
    health = client.get("/health")
    assert health.status_code in (200, 503)  # Redis and the database decide; the engine does not
    assert health.json()["model"]["state"] == "remote"
    assert health.json()["model"]["engines"][0]["reachable"] is False
