"""Figures from per-request token time stamps: throughput, TTFT, inter-token latency, feeding.

Every peer reports the same thing, a `Trace` per request (when it arrived, when each of its
tokens became available), plus how many tokens it fed the model; the figures are computed
here once, so they mean the same for every peer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Trace:
    """One request: arrival time and the time each generated token became available.

    An HTTP peer stamps chunks, not tokens, and takes the token count from the server's usage
    (`tokens`); in-process peers stamp every token and leave it None.
    """

    arrival: float
    stamps: list[float] = field(default_factory=list)
    tokens: int | None = None

    @property
    def generated(self) -> int:
        """Tokens generated: the server's count where there is one, else one per stamp."""
        return len(self.stamps) if self.tokens is None else self.tokens

    @property
    def ttft(self) -> float:
        """Seconds from arrival to the first token."""
        return self.stamps[0] - self.arrival

    @property
    def gaps(self) -> list[float]:
        """Inter-token latencies (seconds) between consecutive tokens."""
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


@dataclass
class PeerRun:
    """What a peer hands back: per-request traces and the tokens it fed the model."""

    traces: list[Trace]
    tokens_fed: int
    started: float
    ended: float
    texts: list[str] = field(default_factory=list)
    chunks: int | None = None  # stream chunks received, HTTP peers only


@dataclass
class Figures:
    """One row of the results table."""

    system: str
    streams: int
    arrivals: str
    new_tokens: int
    seconds: float
    tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    fed_per_token: float


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `repeats` calls, after `warmup` calls (kernel set-up)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100, linear interpolation), None for no values."""
    return float(np.percentile(values, q)) if values else None


def ms(value: float | None) -> float | None:
    """Seconds to milliseconds, keeping None."""
    return None if value is None else 1000 * value


def summarise(system: str, arrivals: str, new_tokens: int, run: PeerRun) -> Figures:
    """Aggregate tokens/s over the wall time from first arrival to last token."""
    generated = sum(t.generated for t in run.traces)
    seconds = run.ended - run.started
    ttfts = [t.ttft for t in run.traces if t.stamps]
    gaps = [g for t in run.traces for g in t.gaps]
    return Figures(
        system=system,
        streams=len(run.traces),
        arrivals=arrivals,
        new_tokens=new_tokens,
        seconds=seconds,
        tokens_per_s=generated / seconds,
        ttft_p50_ms=ms(percentile(ttfts, 50)),
        ttft_p95_ms=ms(percentile(ttfts, 95)),
        itl_p50_ms=ms(percentile(gaps, 50)),
        itl_p99_ms=ms(percentile(gaps, 99)),
        fed_per_token=run.tokens_fed / generated,
    )


def quarter_ratio(gaps: list[float]) -> float:
    """Median gap of the last quarter over the first: 1.0 means latency stays flat."""
    quarter = len(gaps) // 4
    if quarter == 0:
        raise ValueError("need at least 4 gaps")
    return float(np.median(gaps[-quarter:]) / np.median(gaps[:quarter]))
