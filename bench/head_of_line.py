"""Head-of-line blocking in Tandem's engine: does a busy batch delay a newcomer?

1. TTFT of a request arriving while 31 others decode, against its TTFT on an idle engine.
2. A 2,000-token prompt arriving mid-stream: the 31 decoders' inter-token latency during its
   (chunked) prefill, against their latency just before it arrived.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from bench.peers.tandem import TandemPeer
from bench.stats import Trace

BACKGROUND = 31
ENDLESS = 1_000_000
LONG_TEXT = (
    "Continuous batching lets an inference server admit new requests between decoding "
    "steps instead of waiting for a whole batch to finish. "
)


@dataclass
class HeadOfLine:
    """The figures, in milliseconds."""

    idle_ttft_ms: float
    loaded_ttft_ms: float
    loaded_over_idle: float
    long_prompt_tokens: int
    long_prompt_ttft_ms: float
    itl_before_p50_ms: float
    itl_during_p50_ms: float
    itl_during_p99_ms: float
    itl_during_max_ms: float


def long_prompt(tokenizer, size: int) -> list[int]:
    """A prompt of exactly `size` tokens (a repeated paragraph)."""
    ids = tokenizer.encode(LONG_TEXT, add_special_tokens=False)
    return (ids * (size // len(ids) + 1))[:size]


def _probe(peer: TandemPeer, prompt: list[int], new_tokens: int) -> Trace:
    """One request, waited for; its trace."""
    trace, done = Trace(arrival=0.0), threading.Semaphore(0)
    peer.submit(prompt, new_tokens, trace, done)
    done.acquire()
    return trace


def _gaps_until(trace: Trace, moment: float) -> list[float]:
    """The trace's inter-token gaps that ended by `moment`."""
    return [b - a for a, b in zip(trace.stamps, trace.stamps[1:], strict=False) if b <= moment]


def _wait_for(condition, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("background streams did not start decoding")
        time.sleep(0.01)


def run(
    peer: TandemPeer, tokenizer, prompts: list[list[int]], long_tokens: int, repeats: int = 3
) -> HeadOfLine:
    """Idle probes, then 31 endless streams with a short probe and a long prompt among them."""
    probe = prompts[0]
    idle = [_probe(peer, probe, 2).ttft for _ in range(repeats)]

    done = threading.Semaphore(0)
    traces = [Trace(arrival=0.0) for _ in range(BACKGROUND)]
    ids = [
        peer.submit(prompts[i % len(prompts)], ENDLESS, trace, done)
        for i, trace in enumerate(traces)
    ]
    try:
        _wait_for(lambda: all(len(t.stamps) >= 3 for t in traces))
        loaded = [_probe(peer, probe, 2).ttft for _ in range(repeats)]

        _wait_for(lambda: all(len(t.stamps) >= 3 for t in traces))
        arrived = time.perf_counter()
        long = _probe(peer, long_prompt(tokenizer, long_tokens), 1)
        first = long.stamps[0]
        before = [g for t in traces for g in _gaps_until(t, arrived)[-5:]]
        during = [
            b - a
            for t in traces
            for a, b in zip(t.stamps, t.stamps[1:], strict=False)
            if arrived < b <= first
        ]
    finally:
        for request_id in ids:
            peer.engine.cancel(request_id)
        for _ in ids:
            done.acquire()
    idle_ms, loaded_ms = 1000 * float(np.median(idle)), 1000 * float(np.median(loaded))
    return HeadOfLine(
        idle_ttft_ms=idle_ms,
        loaded_ttft_ms=loaded_ms,
        loaded_over_idle=loaded_ms / idle_ms,
        long_prompt_tokens=long_tokens,
        long_prompt_ttft_ms=1000 * long.ttft,
        itl_before_p50_ms=1000 * float(np.median(before)),
        itl_during_p50_ms=1000 * float(np.median(during)) if during else float("nan"),
        itl_during_p99_ms=1000 * float(np.percentile(during, 99)) if during else float("nan"),
        itl_during_max_ms=1000 * max(during, default=float("nan")),
    )
