"""What the operations page shows: the engine, Redis, Celery, message statuses over time, and
a banner for each component that is down. One function, `ops_snapshot`, builds it all for
both the page's first render and its JSON feed, so the two can never disagree.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from chat.models import Message, Part
from chat.states import message_status
from inference.provisioning.recent_stats import recent_stats
from inference.provisioning.runtime import model_runtime
from ops.celery_inspection import celery_overview, recent_failures
from ops.health import check_model, check_redis

STATUSES = [status.value for status in Message.Status]
HOURS = 24


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def engine_overview() -> dict[str, Any]:
    """The model's state and facts, the engine's live counters, and its last minute; with
    remote engines, each one's reachability, last error and latency."""
    info = check_model()
    engine = model_runtime.engine
    stats = engine.stats() if engine is not None else None
    recent = recent_stats.snapshot()
    info["stats"] = asdict(stats) if stats is not None else None
    info["kv_usage"] = (
        stats.kv_tokens_used / stats.kv_tokens_capacity
        if stats is not None and stats.kv_tokens_capacity
        else None
    )
    info["recent"] = {
        "window_seconds": recent.window_seconds,
        "tokens": recent.tokens,
        "tokens_per_second": round(recent.tokens_per_second, 2),
        "requests_started": recent.requests_started,
        "ttft_ms": {"p50": milliseconds(recent.ttft_p50), "p95": milliseconds(recent.ttft_p95)},
        "itl_ms": {"p50": milliseconds(recent.itl_p50), "p95": milliseconds(recent.itl_p95)},
    }
    return info


def status_counts(now: datetime | None = None, hours: int = HOURS) -> dict[str, Any]:
    """Assistant replies started in the last `hours` hours, per hour and derived status.

    One query: the part states of those replies; the status is derived here with the same
    rule as everywhere else (chat.states.message_status), since it is never stored.
    """
    now = now or timezone.now()
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    rows = Part.objects.filter(
        message__role=Message.Role.ASSISTANT, message__created_at__gte=first
    ).values_list("message_id", "message__created_at", "state")
    states: dict[int, list[str]] = defaultdict(list)
    started: dict[int, datetime] = {}
    for message_id, created_at, state in rows:
        states[message_id].append(state)
        started[message_id] = created_at
    buckets = [
        {"start": first + timedelta(hours=index), "counts": dict.fromkeys(STATUSES, 0)}
        for index in range(hours)
    ]
    totals = dict.fromkeys(STATUSES, 0)
    for message_id, part_states in states.items():
        index = min(int((started[message_id] - first).total_seconds() // 3600), hours - 1)
        status = message_status(part_states)
        buckets[index]["counts"][status] += 1
        totals[status] += 1
    return {"since": first, "bucket_seconds": 3600, "buckets": buckets, "totals": totals}


def banners(redis: dict[str, str], celery: dict[str, Any], engine: dict[str, Any]) -> list[dict]:
    """One clear line per component that is down or not ready, worst first."""
    found = []
    if redis["state"] != "ok":
        found.append(
            {
                "component": "redis",
                "level": "error",
                "text": f"Redis is unreachable ({redis.get('error', '')}): replies cannot "
                "stream and no image can be queued.",
            }
        )
    if not celery["workers"]:
        reason = (
            "Redis is down"
            if redis["state"] != "ok"
            else celery.get("error") or "none answered the ping"
        )
        found.append(
            {
                "component": "workers",
                "level": "error",
                "text": f"No Celery workers online ({reason}): images wait in the queue.",
            }
        )
    state = engine["state"]
    for remote in engine.get("engines", []):
        if not remote["reachable"]:
            found.append(
                {
                    "component": "model",
                    "level": "error",
                    "text": f"The engine at {remote['url']} is unreachable "
                    f"({remote['last_error'] or 'no answer'}): replies go to the other "
                    "engines, or fail when none answers.",
                }
            )
    if state not in ("ready", "remote"):
        text = {
            "loading": "The model is still loading: replies wait until it is ready.",
            "error": f"The model failed to load: {engine.get('error', '')}",
            "disabled": "The model is disabled (TANDEM_LOAD_MODEL=0): no replies are written.",
        }.get(state, f"The model is not loaded in this process (state {state}).")
        found.append(
            {
                "component": "model",
                "level": "warning" if state == "loading" else "error",
                "text": text,
            }
        )
    compile_state = str(engine.get("compile", "off"))
    if state == "ready" and compile_state == "warming":
        found.append(
            {
                "component": "model",
                "level": "info",
                "text": "The compiled decode step is warming: replies run eagerly (slower) "
                "in the buckets not ready yet.",
            }
        )
    elif state == "ready" and compile_state.startswith("failed"):
        found.append(
            {
                "component": "model",
                "level": "warning",
                "text": f"The compiled decode step {compile_state}; replies run eagerly.",
            }
        )
    return found


def ops_snapshot() -> dict[str, Any]:
    """Everything the page shows, probed now with short timeouts (TANDEM_HEALTH_TIMEOUT)."""
    timeout = settings.TANDEM_HEALTH_TIMEOUT
    redis = check_redis()
    celery = celery_overview(timeout)
    engine = engine_overview()
    return {
        "generated_at": timezone.now(),
        "banners": banners(redis, celery, engine),
        "engine": engine,
        "redis": redis,
        "celery": celery,
        "failures": recent_failures(),
        "messages": status_counts(),
    }
