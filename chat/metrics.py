"""Chat counters for /metrics, kept in Redis so that every process adds to them.

Why Redis and not the alternatives:
- prometheus_client's in-process counters live in one process, but images are drawn and the
  sweeper runs in Celery workers, which the web process's /metrics never sees. Its
  multiprocess mode needs every process on one host sharing one directory; workers may run
  on other hosts (docs/workers.md).
- Counting rows at scrape time gives gauges, not counters: deleting a conversation deletes
  its messages, parts and sweeper actions, and a retried image leaves `failed`, so the
  numbers would go down, which Prometheus reads as a reset and turns into a false spike.
So the code that makes each event happen adds one to a field of one Redis hash (HINCRBY:
atomic, from any process on any host), after the change has committed, and the collector
reads the whole hash with one HGETALL when Prometheus scrapes the web process. The counts
never go down; they restart from zero only if Redis loses its data, which Prometheus reads
as a counter reset, like a process restart. An event that cannot reach Redis is not counted
and is logged; it never fails the caller. Other apps (media) record into the same hash with
`record` and add their families to the one collector, so a scrape stays one round trip.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator

import redis
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from chat.models import Part
from chat.states import ALLOWED, TERMINAL
from config.redis_client import redis_client

log = logging.getLogger(__name__)

KEY = "tandem:metrics"
IMAGE_SECONDS_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 300.0)
Families = Callable[[dict[str, float]], Iterable[Metric]]


def final_states(kind: str) -> list[str]:
    """The final states a part of `kind` can reach, from its state machine."""
    reachable = {target for targets in ALLOWED[kind].values() for target in targets}
    return sorted(reachable & TERMINAL)


def record(what: str, write: Callable[[redis.client.Pipeline], object]) -> None:
    """Apply `write` to the hash in one MULTI, so a scrape never sees half an observation."""
    try:
        pipe = redis_client().pipeline(transaction=True)
        write(pipe)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("metric %s not counted: %s", what, exc)


def turn_created(wants_image: bool) -> None:
    """A turn was committed: one more assistant reply."""
    field = f"turns:{str(wants_image).lower()}"
    record("turns", lambda pipe: pipe.hincrby(KEY, field, 1))


def part_finished(part: Part) -> None:
    """A part reached a final state; an image that ran is also timed, start to finish."""

    def write(pipe: redis.client.Pipeline) -> None:
        pipe.hincrby(KEY, f"parts:{part.kind}:{part.state}", 1)
        if part.kind == Part.Kind.IMAGE and part.started_at and part.finished_at:
            seconds = max((part.finished_at - part.started_at).total_seconds(), 0.0)
            bucket = bisect.bisect_left(IMAGE_SECONDS_BUCKETS, seconds)  # first le >= seconds
            pipe.hincrby(KEY, f"image_seconds:{part.state}:{bucket}", 1)
            pipe.hincrbyfloat(KEY, f"image_seconds:{part.state}:sum", seconds)

    record("parts finished", write)


def families(values: dict[str, float]) -> Iterator[Metric]:
    """The chat's families from the hash's fields; every known label set, zero when unseen."""
    turns = CounterMetricFamily(
        "tandem_chat_turns",
        "Assistant replies started, by whether an image was asked for.",
        labels=["image"],
    )
    for image in ("false", "true"):
        turns.add_metric([image], values.get(f"turns:{image}", 0))
    yield turns

    parts = CounterMetricFamily(
        "tandem_chat_parts_finished",
        "Parts that reached a final state (a retried image counts once per ending).",
        labels=["kind", "state"],
    )
    for kind in Part.Kind.values:
        for state in final_states(kind):
            parts.add_metric([kind, state], values.get(f"parts:{kind}:{state}", 0))
    yield parts

    durations = HistogramMetricFamily(
        "tandem_media_image_duration_seconds",
        "Images from the start of their last run to their final state.",
        labels=["state"],
    )
    for state in final_states(Part.Kind.IMAGE):
        counts = [
            values.get(f"image_seconds:{state}:{index}", 0)
            for index in range(len(IMAGE_SECONDS_BUCKETS) + 1)
        ]
        cumulative, buckets = 0.0, []
        for bound, count in zip([*IMAGE_SECONDS_BUCKETS, "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((str(bound), cumulative))
        total = values.get(f"image_seconds:{state}:sum", 0)
        durations.add_metric([state], buckets=buckets, sum_value=total)
    yield durations


class CounterCollector(Collector):
    """Reads the counters from Redis when Prometheus scrapes; one round trip for every app."""

    def __init__(self) -> None:
        self.sources: list[Families] = [families]

    def add(self, source: Families) -> None:
        """Add another app's families, built from the same hash's fields."""
        self.sources.append(source)

    def families(self, values: dict[str, float]) -> Iterator[Metric]:
        for source in self.sources:
            yield from source(values)

    def describe(self) -> Iterator[Metric]:
        """The families without asking Redis (prometheus_client calls this on register)."""
        return self.families({})

    def collect(self) -> Iterator[Metric]:
        try:
            raw = redis_client().hgetall(KEY)
        except redis.RedisError as exc:
            log.warning("chat and media metrics left out of this scrape: %s", exc)
            return iter(())
        return self.families({field.decode(): float(value) for field, value in raw.items()})


collector = CounterCollector()
