"""The rolling last-minute window behind the ops page's tokens/s, TTFT and ITL figures."""

from __future__ import annotations

import numpy
import pytest
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from inference.engine import Engine, EngineConfig, EngineObserver, SamplingParams
from inference.provisioning import model_source
from inference.provisioning.recent_stats import ObserverChain, RecentStats
from tests.engine.helpers import sharpen, tiny_config


class Clock:
    """A hand-moved clock, so the window's edge is exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_empty_window_reports_no_latencies():
    snapshot = RecentStats().snapshot()
    assert snapshot.tokens == 0 and snapshot.tokens_per_second == 0
    assert snapshot.ttft_p50 is None and snapshot.itl_p95 is None


def test_rate_and_percentiles_cover_only_the_last_window():
    clock = Clock()
    stats = RecentStats(window=60, clock=clock)
    # An old request: 1 s TTFT, 500 ms gaps; it must leave the window entirely.
    stats.on_first_token("old", 1.0)
    for _ in range(50):
        stats.on_token("old", 0.5)
    clock.now += 61
    # Within the window: 120 tokens from 3 requests, gaps 1..117 ms.
    for ttft, request in ((0.1, "a"), (0.2, "b"), (0.9, "c")):
        stats.on_first_token(request, ttft)
        stats.on_token(request, None)
    gaps = [ms / 1000 for ms in range(1, 118)]
    for gap in gaps:
        stats.on_token("a", gap)
        clock.now += 0.1
    snapshot = stats.snapshot()
    assert snapshot.tokens == 120
    assert snapshot.tokens_per_second == pytest.approx(2.0)
    assert snapshot.requests_started == 3
    assert snapshot.ttft_p50 == pytest.approx(0.2)
    assert snapshot.ttft_p95 == pytest.approx(numpy.percentile([0.1, 0.2, 0.9], 95))
    assert snapshot.itl_p50 == pytest.approx(0.059)
    assert snapshot.itl_p95 == pytest.approx(numpy.percentile(gaps, 95))
    # A minute later, nothing is left.
    clock.now += 60.5
    assert stats.snapshot().tokens == 0 and stats.snapshot().ttft_p95 is None


def test_memory_stays_bounded_under_a_flood():
    stats = RecentStats(max_samples=1000)
    for _ in range(5000):
        stats.on_token("r", 0.01)
    assert stats.snapshot().tokens == 1000


def test_the_chain_feeds_every_observer():
    seen = []

    class Spy(EngineObserver):
        def on_token(self, request_id, inter_token_time):
            seen.append((request_id, inter_token_time))

    window = RecentStats()
    ObserverChain(Spy(), window).on_token("r", 0.02)
    assert seen == [("r", 0.02)] and window.snapshot().tokens == 1


def test_a_real_engine_run_fills_the_window():
    """Every generated token and every first-token time of a real engine run is in the window."""
    tokenizer = AutoTokenizer.from_pretrained(model_source.resolve(None).directory)
    model = sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config())))
    window = RecentStats()
    chain = ObserverChain(EngineObserver(), window)
    engine = Engine(model, tokenizer, EngineConfig(), observer=chain).start()
    prompts = [tokenizer.encode(text) for text in ("one", "two words", "three more words")]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    try:
        results = engine.generate_batch([(None, p, params) for p in prompts], timeout=60)
    finally:
        engine.shutdown()
    snapshot = window.snapshot()
    generated = sum(result.usage.completion_tokens for result in results)
    assert generated == 36 and snapshot.tokens == generated
    assert snapshot.requests_started == 3
    ttfts = [result.timings.ttft for result in results]
    assert snapshot.ttft_p50 == pytest.approx(numpy.percentile(ttfts, 50), abs=0.005)
    assert 0 < snapshot.itl_p50 <= snapshot.itl_p95
