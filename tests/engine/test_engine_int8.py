"""TANDEM_WEIGHTS=int8: per-row int8 of the dense weights on torch's int8 kernel; quality."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.weights_quality import TEXT, perplexity
from inference.engine.weights import choice, crossover
from inference.engine.weights.choice import build_runner
from inference.engine.weights.projection import Projection
from inference.provisioning import loading
from tests.engine.helpers import alone_and_together, canonical_answer, sharpen, tiny_config

ALWAYS_INT8 = 1 << 20


def tiny_bf16() -> LlamaForCausalLM:
    torch.manual_seed(4)
    return sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config()))).to(torch.bfloat16)


def test_int8_packing_rounds_each_row_to_its_own_scale() -> None:
    """The dense packing holds exactly what the int8 kernel multiplies by."""
    weight = torch.randn(48, 64, dtype=torch.bfloat16)
    projection = Projection.from_dense_int8(weight, None, max_rows=ALWAYS_INT8)
    kind, (q, scales) = projection.small
    assert kind == "int8" and q.dtype == torch.int8 and q.abs().max() == 127
    torch.testing.assert_close(projection.dense, (q.float() * scales.float()[:, None]).bfloat16())
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(projection.small_mm(x), projection.dense_mm(x), rtol=0.02, atol=0.1)
    error = (projection.dense.float() - weight.float()).norm() / weight.float().norm()
    assert error < 0.01


@pytest.mark.parametrize("max_rows", [ALWAYS_INT8, 0], ids=["int8-kernel", "dense-packing"])
def test_int8_batch_invariance(tokenizer, make_engine, max_rows) -> None:
    """bf16: a request's tokens do not depend on its companions, on either kernel."""
    model = tiny_bf16()
    runner = build_runner(model, "int8", None, max_rows=max_rows)
    assert runner.weights == "int8"
    engine = make_engine(model, tokenizer, runner=runner, max_running=8, max_step_tokens=64)
    alone, together = alone_and_together(engine, 6, (3, 11, 29), 6, 3)
    assert together == alone


def test_auto_follows_the_measured_crossover(monkeypatch) -> None:
    """For a bfloat16 model auto is int8 up to the row count the start-up measurement found;
    the dense weights when the int8 kernel wins at no row count (the timing itself is faked:
    which kernel wins on this machine is what the measurement is for). A float32 model's
    auto is fp16 (test_engine_fp16.py)."""
    dtype = torch.bfloat16
    model = tiny_bf16()
    if choice.int8_missing(model) is not None:
        pytest.skip(choice.int8_missing(model))

    def measured(projections, rows=crossover.ROWS, before=()):
        """The layers' crossover at 4 rows, the lm_head's (timed after them) at 2."""
        return (4, {1: 0.5, 8: 1.2}) if not before else (2, {1: 0.6, 4: 1.1})

    monkeypatch.setattr(choice, "small_max_rows", measured)
    runner = build_runner(model, "auto", None)
    assert runner.weights == "int8"
    assert {p.max_rows for layer in runner.projections for p in vars(layer).values()} == {4}
    assert runner.head is not None and runner.head.max_rows == 2
    monkeypatch.setattr(
        choice, "small_max_rows", lambda projections, rows=(), before=(): (0, {1: 1.3})
    )
    dense = build_runner(tiny_bf16().to(dtype), "auto", None)
    assert dense.weights == "bf16" and dense.head is None


def test_crossover_times_both_packings_of_the_stack() -> None:
    """The start-up measurement returns a row count it timed (or 0) and a ratio per count;
    the lm_head's is timed after the layers, up to the layers' count."""
    runner = build_runner(tiny_bf16(), "int8", None)
    layer = crossover.stack_projections(runner.projections)
    rows, ratios = crossover.small_max_rows(layer)
    assert rows == 0 or rows in crossover.ROWS
    assert ratios and all(r > 0 for r in ratios.values())
    assert all(ratios[r] < crossover.WIN for r in crossover.ROWS if r <= rows)
    assert runner.head.max_rows <= max(p.max_rows for p in layer)


@pytest.mark.model
@pytest.mark.timeout(900)
def test_packaged_int8_quality() -> None:
    """SmolLM2 in int8 (layers and head), in the dtype this CPU runs it in (float32 without
    native bf16: the int8 kernel then gets bf16 rows): perplexity within 1% of the dense
    model's, and the canonical greedy answer."""
    loaded = loading.load(None, "auto")
    if choice.int8_missing(loaded.model):
        pytest.skip(choice.int8_missing(loaded.model))
    int8 = build_runner(loaded.model, "int8", None, max_rows=ALWAYS_INT8)
    dense = build_runner(loaded.model, "bf16", None)
    ids = loaded.tokenizer(TEXT.read_text())["input_ids"]
    bf16_ppl, int8_ppl = perplexity(dense, ids), perplexity(int8, ids)
    assert abs(int8_ppl - bf16_ppl) <= 0.01 * bf16_ppl, (bf16_ppl, int8_ppl)
    assert "Paris" in canonical_answer(loaded, int8)
