"""Media counters for /metrics: image retries and sweeper repairs.

They live in the chat's Redis hash (see chat/metrics.py for why Redis) and are read by its one
collector, to which `MediaConfig.ready` adds `families`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from chat.metrics import KEY, record
from media.models import SweeperAction

RETRY_REASONS = ("transient", "redelivered", "user")


def image_retried(reason: str) -> None:
    """An image starts again: after a transient error, a lost worker, or the user's retry."""
    record("image retries", lambda pipe: pipe.hincrby(KEY, f"retries:{reason}", 1))


def sweeper_action(action: str) -> None:
    """The sweeper repaired a part."""
    record("sweeper actions", lambda pipe: pipe.hincrby(KEY, f"sweeper:{action}", 1))


def families(values: dict[str, float]) -> Iterator[Metric]:
    """The media's families from the hash's fields; every known label set, zero when unseen."""
    retries = CounterMetricFamily(
        "tandem_media_image_retries",
        "Images started again: transient (a Celery retry after a transient error), "
        "redelivered (its worker died), user (the retry button or the admin).",
        labels=["reason"],
    )
    for reason in RETRY_REASONS:
        retries.add_metric([reason], values.get(f"retries:{reason}", 0))
    yield retries

    sweeps = CounterMetricFamily(
        "tandem_media_sweeper_actions", "Repairs made by the sweeper.", labels=["action"]
    )
    for action in SweeperAction.Action.values:
        sweeps.add_metric([action], values.get(f"sweeper:{action}", 0))
    yield sweeps
