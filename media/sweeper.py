"""The sweeper: repairs parts whose message, worker or web process went missing.

Celery beat runs it every TANDEM_SWEEP_INTERVAL seconds. Three repairs, each logged and
recorded as a SweeperAction (visible in the admin):
- an image `queued` longer than TANDEM_QUEUED_STALE_AFTER is sent again (its message never
  reached the broker, or the broker lost it); a duplicate is harmless, see media/rendering.py;
- an image `running` longer than the hard time limit plus TANDEM_RUNNING_GRACE is failed:
  no worker can still be drawing it;
- a text part whose streaming web process stopped heartbeating is marked `interrupted`,
  keeping the text streamed so far (the saved text plus the live deltas in Redis).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from chat import heartbeat, live_text
from chat.models import Part
from chat.parts import part_transition
from media import metrics
from media.models import SweeperAction
from media.services import image_enqueue

log = logging.getLogger(__name__)

TEXT_ORPHANED = "the web process streaming this reply stopped"


def sweep() -> list[SweeperAction]:
    """Run every repair once; returns what was done."""
    now = timezone.now()
    return [*requeue_stale_images(now), *fail_vanished_images(now), *interrupt_orphaned_text(now)]


def record(action: str, part: Part, detail: str) -> SweeperAction:
    log.warning("sweeper %s part %s: %s", action, part.pk, detail, extra={"part_id": part.pk})
    recorded = SweeperAction.objects.create(action=action, part=part, detail=detail)
    metrics.sweeper_action(action)
    return recorded


def requeue_stale_images(now: datetime) -> list[SweeperAction]:
    """Send again the image parts that have waited in `queued` too long."""
    cutoff = now - timedelta(seconds=settings.TANDEM_QUEUED_STALE_AFTER)
    stale = Part.objects.filter(kind=Part.Kind.IMAGE, state=Part.State.QUEUED).filter(
        Q(queued_at__lt=cutoff) | Q(queued_at__isnull=True, updated_at__lt=cutoff)
    )
    actions = []
    for part in stale:
        since = part.queued_at or part.updated_at
        if image_enqueue(part):
            waited = (now - since).total_seconds()
            actions.append(
                record(
                    SweeperAction.Action.REQUEUED,
                    part,
                    f"queued for {waited:.0f} s without starting; sent to the queue again",
                )
            )
    return actions


def fail_vanished_images(now: datetime) -> list[SweeperAction]:
    """Fail the image parts still `running` after the hard time limit plus the grace."""
    limit = settings.CELERY_TASK_TIME_LIMIT + settings.TANDEM_RUNNING_GRACE
    stuck = Part.objects.filter(
        kind=Part.Kind.IMAGE,
        state=Part.State.RUNNING,
        started_at__lt=now - timedelta(seconds=limit),
    )
    actions = []
    for part in stuck:
        reason = f"The worker drawing this image stopped: no result {limit} s after it started."
        if part_transition(part.pk, Part.State.FAILED, error=reason, finished_at=now):
            actions.append(record(SweeperAction.Action.FAILED, part, reason))
    return actions


def interrupt_orphaned_text(now: datetime) -> list[SweeperAction]:
    """Mark `interrupted` the unfinished text parts whose web process stopped heartbeating.

    A part must also have been quiet for a heartbeat TTL, so a Redis restart (which drops
    every heartbeat key until the next beat) cannot interrupt a stream that is still alive.
    """
    quiet_since = now - timedelta(seconds=settings.TANDEM_HEARTBEAT_TTL)
    unfinished = Part.objects.filter(
        kind=Part.Kind.TEXT,
        state__in=[Part.State.QUEUED, Part.State.STREAMING],
        updated_at__lt=quiet_since,
    ).exclude(stream_owner="")
    alive: dict[str, bool] = {}
    actions = []
    for part in unfinished:
        owner = part.stream_owner
        if owner not in alive:
            try:
                alive[owner] = heartbeat.is_alive(owner)
            except redis.RedisError:
                log.warning("sweeper: cannot check web process %s; skipping its parts", owner)
                alive[owner] = True
        if alive[owner]:
            continue
        text, seq = live_text.streamed(part)
        interrupted = part_transition(
            part.pk,
            Part.State.INTERRUPTED,
            text=text,
            seq=seq,
            error=TEXT_ORPHANED,
            finished_at=now,
        )
        if interrupted:
            live_text.expire(part.pk)  # saved whole now; the live tail may go
            actions.append(
                record(
                    SweeperAction.Action.INTERRUPTED,
                    part,
                    f"{TEXT_ORPHANED} ({owner}); kept {len(interrupted.text)} characters of text",
                )
            )
    return actions
