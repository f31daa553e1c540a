"""Hooks for metrics: subclass EngineObserver and override what you measure.

Every method runs on the engine thread inside the step loop, so it must be cheap and must
not block (increment a counter, observe a histogram). An exception is logged and ignored.
"""

from __future__ import annotations

from inference.engine.events import FinishReason, Timings, Usage


class EngineObserver:
    """No-op base; the web layer wires Prometheus metrics by overriding these."""

    def on_admit(self, request_id: str, queue_time: float) -> None:
        """A waiting request got a slot after `queue_time` seconds."""

    def on_first_token(self, request_id: str, ttft: float) -> None:
        """A request produced its first token, `ttft` seconds after submission."""

    def on_token(self, request_id: str, inter_token_time: float | None) -> None:
        """A request produced a token; the gap since its previous one (None for the first)."""

    def on_finish(
        self, request_id: str, reason: FinishReason, usage: Usage, timings: Timings
    ) -> None:
        """A request ended (any reason, including cancelled and error)."""

    def on_step(
        self, batch_size: int, num_tokens: int, prefill_tokens: int, seconds: float
    ) -> None:
        """A step ran `batch_size` sequences over `num_tokens` tokens in `seconds`."""
