"""The engine's last minute for the ops page: tokens/s and TTFT / inter-token latency p50 and p95.

Prometheus histograms answer "since start" (and percentiles only through a query server);
an operator looking at /ops/ wants "right now". The engine thread appends one timestamp per
token under a lock (no pruning, no sorting there); the page's reader drops what is older than
the window and copies the rest under that lock, then sorts outside it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy

from inference.engine import EngineObserver, FinishReason, Timings, Usage

WINDOW_SECONDS = 60.0
# Bounds memory at a few MB even at thousands of tokens/s; beyond it the oldest go first.
MAX_SAMPLES = 200_000


@dataclass(frozen=True)
class RecentSnapshot:
    """What the window holds now; latencies in seconds, None when nothing was measured."""

    window_seconds: float
    tokens: int
    tokens_per_second: float
    requests_started: int
    ttft_p50: float | None
    ttft_p95: float | None
    itl_p50: float | None
    itl_p95: float | None


def percentiles(values: list[float]) -> tuple[float | None, float | None]:
    """p50 and p95 (linear interpolation, numpy's default); (None, None) when empty."""
    if not values:
        return None, None
    p50, p95 = numpy.percentile(values, [50, 95])
    return float(p50), float(p95)


class RecentStats(EngineObserver):
    """A rolling window over the engine's observer hooks; `snapshot()` reads it."""

    def __init__(
        self,
        window: float = WINDOW_SECONDS,
        max_samples: int = MAX_SAMPLES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: deque[float] = deque(maxlen=max_samples)
        self._ttft: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._itl: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def on_first_token(self, request_id: str, ttft: float) -> None:
        now = self._clock()
        with self._lock:
            self._ttft.append((now, ttft))

    def on_token(self, request_id: str, inter_token_time: float | None) -> None:
        now = self._clock()
        with self._lock:
            self._tokens.append(now)
            if inter_token_time is not None:
                self._itl.append((now, inter_token_time))

    def snapshot(self) -> RecentSnapshot:
        """Drop samples older than the window, then summarise the rest."""
        now = self._clock()
        cutoff = now - self.window
        with self._lock:
            while self._tokens and self._tokens[0] < cutoff:
                self._tokens.popleft()
            for samples in (self._ttft, self._itl):
                while samples and samples[0][0] < cutoff:
                    samples.popleft()
            tokens = len(self._tokens)
            ttft = list(self._ttft)  # a C-level copy: the engine thread waits only for this
            itl = list(self._itl)
        ttft_p50, ttft_p95 = percentiles([value for _, value in ttft])
        itl_p50, itl_p95 = percentiles([value for _, value in itl])
        return RecentSnapshot(
            window_seconds=self.window,
            tokens=tokens,
            tokens_per_second=tokens / self.window,
            requests_started=len(ttft),
            ttft_p50=ttft_p50,
            ttft_p95=ttft_p95,
            itl_p50=itl_p50,
            itl_p95=itl_p95,
        )


class ObserverChain(EngineObserver):
    """Hands every hook to several observers in turn (Prometheus and the rolling window)."""

    def __init__(self, *observers: EngineObserver) -> None:
        self.observers = observers

    def on_admit(self, request_id: str, queue_time: float) -> None:
        for observer in self.observers:
            observer.on_admit(request_id, queue_time)

    def on_first_token(self, request_id: str, ttft: float) -> None:
        for observer in self.observers:
            observer.on_first_token(request_id, ttft)

    def on_token(self, request_id: str, inter_token_time: float | None) -> None:
        for observer in self.observers:
            observer.on_token(request_id, inter_token_time)

    def on_finish(
        self, request_id: str, reason: FinishReason, usage: Usage, timings: Timings
    ) -> None:
        for observer in self.observers:
            observer.on_finish(request_id, reason, usage, timings)

    def on_step(
        self, batch_size: int, num_tokens: int, prefill_tokens: int, seconds: float
    ) -> None:
        for observer in self.observers:
            observer.on_step(batch_size, num_tokens, prefill_tokens, seconds)


# The web process's one window, fed by its engine (provisioning/startup.py), read by /ops/.
recent_stats = RecentStats()
