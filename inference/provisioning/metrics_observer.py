"""The engine observer that feeds the Prometheus histograms and counters of `metrics.py`."""

from __future__ import annotations

from inference.engine import EngineObserver, FinishReason, Timings, Usage
from inference.provisioning.metrics import (
    E2E,
    FAILURES,
    FINISHED,
    GENERATED_TOKENS,
    ITL,
    PROMPT_TOKENS,
    QUEUE_TIME,
    STEP_BATCH,
    TTFT,
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
