"""Prometheus metrics of the engine: histograms and counters fed by the engine's observer
hooks, gauges read from `Engine.stats()` at scrape time (so they are never stale)."""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inference.engine import EngineObserver, FinishReason, Timings, Usage

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

TTFT = Histogram(
    "tandem_engine_time_to_first_token_seconds",
    "Submission to first generated token.",
    buckets=LATENCY_BUCKETS,
)
ITL = Histogram(
    "tandem_engine_inter_token_latency_seconds",
    "Gap between consecutive tokens of one request.",
    buckets=LATENCY_BUCKETS,
)
QUEUE_TIME = Histogram(
    "tandem_engine_queue_time_seconds",
    "Time a request waited for a batch slot.",
    buckets=LATENCY_BUCKETS,
)
E2E = Histogram(
    "tandem_engine_request_duration_seconds",
    "Submission to finish, any finish reason.",
    buckets=LATENCY_BUCKETS,
)
STEP_BATCH = Histogram(
    "tandem_engine_step_batch_size",
    "Sequences in one engine step.",
    buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 128),
)
PROMPT_TOKENS = Counter("tandem_engine_prompt_tokens", "Prompt tokens of finished requests.")
GENERATED_TOKENS = Counter("tandem_engine_generated_tokens", "Tokens generated.")
FINISHED = Counter("tandem_engine_requests_finished", "Requests finished, by reason.", ["reason"])
FAILURES = Counter(
    "tandem_engine_failures", "Requests that did not complete normally, by reason.", ["reason"]
)
REJECTED = Counter(
    "tandem_engine_requests_rejected", "Requests refused before admission, by reason.", ["reason"]
)

FAILED_REASONS = {FinishReason.ERROR, FinishReason.CANCELLED}


class PrometheusObserver(EngineObserver):
    """Feeds the histograms and counters from the engine thread (cheap, non-blocking)."""

    def on_admit(self, request_id: str, queue_time: float) -> None:
        QUEUE_TIME.observe(queue_time)

    def on_first_token(self, request_id: str, ttft: float) -> None:
        TTFT.observe(ttft)

    def on_token(self, request_id: str, inter_token_time: float | None) -> None:
        GENERATED_TOKENS.inc()
        if inter_token_time is not None:
            ITL.observe(inter_token_time)

    def on_finish(
        self, request_id: str, reason: FinishReason, usage: Usage, timings: Timings
    ) -> None:
        FINISHED.labels(reason=reason.value).inc()
        PROMPT_TOKENS.inc(usage.prompt_tokens)
        E2E.observe(timings.duration)
        if reason in FAILED_REASONS:
            FAILURES.labels(reason=reason.value).inc()

    def on_step(
        self, batch_size: int, num_tokens: int, prefill_tokens: int, seconds: float
    ) -> None:
        STEP_BATCH.observe(batch_size)


class EngineStatsCollector(Collector):
    """Gauges of the running engine, read when Prometheus scrapes."""

    def collect(self):
        from inference.runtime import model_runtime

        engine = model_runtime.engine
        stats = engine.stats() if engine is not None else None
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


REGISTRY.register(EngineStatsCollector())
