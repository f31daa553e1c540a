"""Prometheus metrics of the engine: histograms and counters fed by the engine's observer
hooks (`metrics_observer.py`) and the API's refusals, gauges read from `Engine.stats()` at
scrape time (so they are never stale).

Importing this module registers nothing and imports no torch: `InferenceConfig.ready()` calls
`register` once per process, handing in how to reach the running engine's stats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from inference.engine import EngineStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

TTFT = Histogram(
    "tandem_engine_time_to_first_token_seconds",
    "Submission to first generated token.",
    buckets=LATENCY_BUCKETS,
    registry=None,
)
ITL = Histogram(
    "tandem_engine_inter_token_latency_seconds",
    "Gap between consecutive tokens of one request.",
    buckets=LATENCY_BUCKETS,
    registry=None,
)
QUEUE_TIME = Histogram(
    "tandem_engine_queue_time_seconds",
    "Time a request waited for a batch slot.",
    buckets=LATENCY_BUCKETS,
    registry=None,
)
E2E = Histogram(
    "tandem_engine_request_duration_seconds",
    "Submission to finish, any finish reason.",
    buckets=LATENCY_BUCKETS,
    registry=None,
)
STEP_BATCH = Histogram(
    "tandem_engine_step_batch_size",
    "Sequences in one engine step.",
    buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 128),
    registry=None,
)
PROMPT_TOKENS = Counter(
    "tandem_engine_prompt_tokens", "Prompt tokens of finished requests.", registry=None
)
GENERATED_TOKENS = Counter("tandem_engine_generated_tokens", "Tokens generated.", registry=None)
FINISHED = Counter(
    "tandem_engine_requests_finished", "Requests finished, by reason.", ["reason"], registry=None
)
FAILURES = Counter(
    "tandem_engine_failures",
    "Requests that did not complete normally, by reason.",
    ["reason"],
    registry=None,
)
REJECTED = Counter(
    "tandem_engine_requests_rejected",
    "Requests refused before admission, by reason.",
    ["reason"],
    registry=None,
)

METRICS = (
    TTFT,
    ITL,
    QUEUE_TIME,
    E2E,
    STEP_BATCH,
    PROMPT_TOKENS,
    GENERATED_TOKENS,
    FINISHED,
    FAILURES,
    REJECTED,
)


class EngineStatsCollector(Collector):
    """Gauges of the running engine, read when Prometheus scrapes."""

    def __init__(self, engine_stats: Callable[[], EngineStats | None]) -> None:
        self.engine_stats = engine_stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.engine_stats()
        values = {
            "tandem_engine_running_requests": ("Requests decoding now.", "running"),
            "tandem_engine_waiting_requests": ("Requests waiting for a slot.", "waiting"),
            "tandem_engine_batch_size": ("Sequences in the running batch.", "kv_slots_used"),
            "tandem_engine_kv_cache_used_tokens": ("Tokens held in KV cache.", "kv_tokens_used"),
            "tandem_engine_kv_cache_capacity_tokens": (
                "Token positions allocated in the KV cache.",
                "kv_tokens_capacity",
            ),
        }
        for name, (doc, attr) in values.items():
            yield GaugeMetricFamily(name, doc, value=getattr(stats, attr) if stats else 0)
        usage = 0.0
        if stats and stats.kv_tokens_capacity:
            usage = stats.kv_tokens_used / stats.kv_tokens_capacity
        yield GaugeMetricFamily(
            "tandem_engine_kv_cache_usage_ratio", "Used / allocated KV positions.", value=usage
        )
        yield CounterMetricFamily(
            "tandem_engine_prompt_tokens_reused",
            "Prompt tokens taken from KV rows a free slot still held, not prefilled again.",
            value=stats.prompt_tokens_reused if stats else 0,
        )


def register(registry: CollectorRegistry, engine_stats: Callable[[], EngineStats | None]) -> None:
    """Expose the histograms and counters, and gauges read through `engine_stats` (None while
    this process has no engine)."""
    for metric in METRICS:
        registry.register(metric)
    registry.register(EngineStatsCollector(engine_stats))
