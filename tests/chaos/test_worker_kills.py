"""SIGKILL the Celery worker in the middle of an image, ten times: every image ends once.

Two workers share the media queue. Each kill lands on a fresh image while it is drawn: most
kill the pool process drawing it (what the OOM killer does; the worker's main process sees it
die and requeues the message at once), some kill the whole worker (main process and pool, as a
crashed host; the unacked message comes back to another worker after the visibility timeout,
and a replacement worker starts meanwhile).
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import pytest
from django.utils import timezone

from chat.models import Part
from media.services import image_enqueue
from tests.chaos.conftest import FINAL, record_figures, seconds_between, wait_terminal
from tests.media.conftest import STEPS, expected_png, make_turn, stored_images, terminal_states
from tests.support.media import EventTap, Worker, celery_broker, start_worker
from tests.support.processes import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

KILLS = 10
WHOLE_WORKER_KILLS = {1, 4}  # the others kill the pool process drawing the image
STEP_DELAY = 0.1  # 12 steps, about 1.2 s a render: time to land a kill in the middle
KILL_TO_FINAL_BOUND = 30.0  # seconds from a kill to that image's final state


def pool_pid(main_pid: int) -> int:
    """The worker's one pool process (concurrency 1), read from /proc."""
    children = Path(f"/proc/{main_pid}/task/{main_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def drawing(workers: list[Worker], starting: list[Future], task_id: str) -> Worker:
    """The live worker that received the task (each image is killed once, so only one did);
    replacement workers that became ready join `workers` first."""
    ready = [future for future in starting if future.done()]
    workers.extend(future.result() for future in ready)
    starting[:] = [future for future in starting if future not in ready]
    [worker] = [
        worker
        for worker in workers
        if worker.service.alive() and worker.log_count(f"render_image[{task_id}] received")
    ]
    return worker


def test_ten_kills_mid_image_leave_every_image_final_exactly_once(
    service_logs, private_redis, tmp_path, settings
):
    settings.MEDIA_ROOT = tmp_path / "media"
    env = {
        "REDIS_URL": private_redis.url,
        "MEDIA_ROOT": str(settings.MEDIA_ROOT),
        "TANDEM_IMAGE_STEPS": str(STEPS),
        "TANDEM_IMAGE_STEP_DELAY": str(STEP_DELAY),
        "TANDEM_IMAGE_SOFT_TIME_LIMIT": "3",
        "TANDEM_IMAGE_TIME_LIMIT": "4",
        "TANDEM_VISIBILITY_MARGIN": "1",
    }
    started = time.monotonic()
    killed: dict[int, datetime] = {}  # image part id -> when its render was killed
    kinds = {"pool_process": 0, "whole_worker": 0}
    missed = 0  # kills that landed just after the image finished: not counted
    taps: dict[int, EventTap] = {}
    with ExitStack() as stack, ThreadPoolExecutor(2) as starter:
        workers = list(starter.map(lambda _: start_worker(service_logs, **env), range(2)))
        replacements: list[Future] = []
        stack.callback(lambda: [worker.service.stop() for worker in workers])
        stack.callback(lambda: workers.extend(f.result() for f in replacements))
        while len(killed) < KILLS and missed < KILLS:
            turn = make_turn()
            taps[turn.image.pk] = stack.enter_context(
                EventTap(turn.conversation.pk, private_redis.url)
            )
            with celery_broker(private_redis.url):
                image_enqueue(turn.image)
            wait_until(lambda turn=turn: turn.refresh().progress > 0, 60, "the image to be drawn")
            worker = drawing(workers, replacements, turn.refresh().task_id)
            whole = len(killed) in WHOLE_WORKER_KILLS
            if whole:
                worker.service.kill(signal.SIGKILL)
                replacements.append(starter.submit(start_worker, service_logs, **env))
            else:
                os.kill(pool_pid(worker.service.pid), signal.SIGKILL)
            if turn.refresh().state != Part.State.RUNNING:
                missed += 1
                continue
            killed[turn.image.pk] = timezone.now()
            kinds["whole_worker" if whole else "pool_process"] += 1
        parts = list(taps)
        wait_terminal(parts, 90, "every killed image to end")
        events = {pk: terminal_states(tap.part_states(pk)) for pk, tap in taps.items()}
        final = {part.pk: part for part in Part.objects.filter(pk__in=parts)}
        workers.extend(f.result() for f in replacements)
        replacements.clear()
        deliveries = {
            pk: sum(w.log_count(f"render_image[{part.task_id}] received") for w in workers)
            for pk, part in final.items()
        }

    once = [pk for pk, states in events.items() if len(states) == 1]
    to_final = [seconds_between(killed[pk], final[pk].finished_at) for pk in killed]
    succeeded = [part for part in final.values() if part.state == Part.State.SUCCEEDED]
    stuck = sum(part.state not in FINAL for part in final.values())
    figures = record_figures(
        "worker_kills",
        f"{len(killed)} SIGKILLs mid-image ({kinds['pool_process']} pool process, "
        f"{kinds['whole_worker']} whole worker): {len(once)}/{len(final)} images final exactly "
        f"once, {len(succeeded)} succeeded, {stuck} stuck, max {max(to_final):.1f} s kill to final",
        kills=len(killed),
        kills_by_kind=kinds,
        kills_missed=missed,
        images=len(final),
        final_exactly_once=len(once),
        final_events_per_image=sorted(len(states) for states in events.values()),
        succeeded=len(succeeded),
        failed=sum(part.state == Part.State.FAILED for part in final.values()),
        stuck=stuck,
        deliveries_per_killed_image=sorted(deliveries[pk] for pk in killed),
        max_seconds_kill_to_final=round(max(to_final), 2),
        mean_seconds_kill_to_final=round(sum(to_final) / len(to_final), 2),
        bound_seconds_kill_to_final=KILL_TO_FINAL_BOUND,
        workers_started=len(workers),
        scenario_seconds=round(time.monotonic() - started, 1),
    )
    assert len(killed) == KILLS and kinds["whole_worker"] == len(WHOLE_WORKER_KILLS)
    assert stuck == 0
    assert len(once) == len(final), events
    assert len(succeeded) == len(final), {pk: (p.state, p.error) for pk, p in final.items()}
    assert figures["max_seconds_kill_to_final"] <= KILL_TO_FINAL_BOUND
    assert all(deliveries[pk] >= 2 for pk in killed)  # drawn again after the kill
    for part in succeeded:
        assert [f.read_bytes() for f in stored_images(settings.MEDIA_ROOT, part)] == [
            expected_png()
        ]
