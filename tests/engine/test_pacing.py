"""The prefill pacer: a step with prefill stays near `multiple` decode steps."""

from __future__ import annotations

import pytest

from inference.engine.pacing import PrefillPacer


def step_seconds(decoders: int, prefill: int) -> float:
    """A cost model like the runner's: decode grows with decoders, a chunk has a fixed cost."""
    decode = 0.020 + 0.001 * decoders
    return decode + (0.012 + 0.0006 * prefill if prefill else 0.0)


def test_nobody_decoding_gets_the_whole_budget() -> None:
    pacer = PrefillPacer(max_tokens=512)
    assert pacer.budget(0) == 512


def test_unknown_costs_start_small() -> None:
    pacer = PrefillPacer(max_tokens=512, min_tokens=8)
    assert pacer.budget(31) == 8
    pacer.observe(31, 0, step_seconds(31, 0))
    assert pacer.budget(31) == 8  # decode known, prefill cost not yet


@pytest.mark.parametrize("multiple", [1.3, 1.6, 2.0])
def test_budget_converges_to_steps_of_multiple_decode_steps(multiple: float) -> None:
    pacer = PrefillPacer(max_tokens=512, multiple=multiple)
    for _ in range(5):
        pacer.observe(31, 0, step_seconds(31, 0))
    for _ in range(60):
        tokens = pacer.budget(31)
        pacer.observe(31, tokens, step_seconds(31, tokens))
    ratio = step_seconds(31, pacer.budget(31)) / step_seconds(31, 0)
    assert ratio == pytest.approx(multiple, rel=0.05)


def test_decode_costs_are_kept_per_decoder_bucket() -> None:
    pacer = PrefillPacer(max_tokens=512)
    for decoders in (1, 32):
        pacer.observe(decoders, 0, step_seconds(decoders, 0))
        pacer.observe(decoders, 16, step_seconds(decoders, 16))
    assert pacer.budget(32) > pacer.budget(1)


def test_no_multiple_means_no_pacing() -> None:
    pacer = PrefillPacer(max_tokens=512, multiple=None)
    pacer.observe(31, 0, 0.05)
    assert pacer.budget(31) == 512


def test_a_prefill_that_costs_nothing_measurable_gets_the_whole_budget() -> None:
    pacer = PrefillPacer(max_tokens=256)
    pacer.observe(4, 0, 0.05)
    pacer.observe(4, 8, 0.04)
    assert pacer.budget(4) == 256
