"""TANDEM_WEIGHTS=fp16: a float32 model's linears on fbgemm's half-precision GEMM; quality."""

from __future__ import annotations

import copy
import gc
import logging

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from bench.weights_quality import TEXT, perplexity
from inference.engine import SamplingParams
from inference.engine.weights import choice, fp16
from inference.engine.weights.choice import build_runner
from inference.engine.weights.projection import Projection
from inference.provisioning import loading
from tests.engine.helpers import (
    WAIT,
    alone_and_together,
    canonical_answer,
    compiled_matches_eager,
    hf_greedy,
    sharpen,
    tiny_config,
)

pytestmark = pytest.mark.skipif(
    fp16.fp16_kernel_missing() is not None, reason=str(fp16.fp16_kernel_missing())
)


def tiny_fp32(seed: int = 6) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config())))


def rounded_to_half(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """A copy whose linears (lm_head included) hold their weights rounded to float16: what
    the fp16 kernel multiplies by, for HF's own float32 arithmetic."""
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(module.weight.half().float())
    return reference


def test_fp16_kernel_multiplies_by_the_weights_rounded_to_half() -> None:
    """Eager calls and the graphs' opaque op give the same rows: x times the rounded weights
    in float32 arithmetic, the bias added once."""
    weight, bias = torch.randn(96, 64) * 0.3, torch.randn(96)
    projection = Projection.from_fp16(weight, bias)
    kind, matrix = projection.small
    assert kind == "fp16" and projection.max_rows > 1 << 20
    x = torch.randn(5, 64)
    expected = x @ weight.half().float().t() + bias
    torch.testing.assert_close(projection(x), expected, rtol=1e-5, atol=1e-5)
    direct = torch.ops.tandem.fp16_linear(x, matrix.handle, matrix.out_features) + bias
    assert torch.equal(projection(x), direct)
    assert (projection(x) - (x @ weight.t() + bias)).abs().max() > 0


def test_a_dropped_matrix_leaves_the_registry() -> None:
    gc.collect()  # earlier tests' matrices leave first
    before = len(fp16._packed)
    matrix = fp16.Fp16Matrix(torch.randn(16, 32))
    assert len(fp16._packed) == before + 1
    del matrix
    gc.collect()
    assert len(fp16._packed) == before


def test_auto_is_fp16_for_a_float32_model_where_q8_loses_and_fp16_needs_one(
    monkeypatch, caplog
) -> None:
    """auto: fp16 on every layer and the head of a float32 model where q8 wins at no row count
    (faked: test_engine_q8.py has the other case); asked for a bfloat16 model, fp16 falls back
    to the dense weights with one warning."""
    monkeypatch.setattr(
        choice, "small_max_rows", lambda projections, rows=(), before=(): (0, {1: 1.3})
    )
    runner = build_runner(tiny_fp32(), "auto", None)
    assert runner.weights == "fp16" and runner.head is not None
    kinds = {p.small[0] for layer in runner.projections for p in vars(layer).values()}
    assert kinds == {"fp16"} and runner.head.small[0] == "fp16"
    with caplog.at_level(logging.WARNING, logger=choice.__name__):
        dense = build_runner(tiny_fp32().to(torch.bfloat16), "fp16", None)
    assert dense.weights == "bf16"
    assert "fp16 unavailable" in caplog.text and "bfloat16" in caplog.text


def test_fp16_greedy_matches_hf_on_the_rounded_weights_and_is_batch_invariant(
    tokenizer, make_engine
) -> None:
    model = tiny_fp32()
    runner = build_runner(model, "fp16", None)
    engine = make_engine(model, tokenizer, runner=runner, max_running=8, max_step_tokens=64)
    reference = rounded_to_half(model)
    for prompt in ([5, 600, 7000], list(range(300, 340))):
        result = engine.generate_batch([(None, prompt, SamplingParams(max_new_tokens=12))], WAIT)
        assert result[0].token_ids == hf_greedy(reference, prompt, 12)
    alone, together = alone_and_together(engine, 7, (3, 11, 29), 6, 3)
    assert together == alone


def test_fp16_compiles_through_its_opaque_op(tokenizer, make_engine) -> None:
    """The graphs call the fp16 matrices at every bucket; greedy equals the eager run's."""
    model = tiny_fp32(8)
    runner = build_runner(model, "fp16", None)
    linears = compiled_matches_eager(model, tokenizer, runner, make_engine)
    assert {m.kind for m in linears} == {"fp16"}


@pytest.mark.model
@pytest.mark.timeout(900)
def test_packaged_fp16_quality() -> None:
    """SmolLM2 in float32 with fp16 layers and head: perplexity within 0.1% of the float32
    weights', and the canonical greedy answer."""
    loaded = loading.load(None, "float32")
    half = build_runner(loaded.model, "fp16", None)
    dense = build_runner(loaded.model, "bf16", None)
    ids = loaded.tokenizer(TEXT.read_text())["input_ids"]
    dense_ppl, half_ppl = perplexity(dense, ids), perplexity(half, ids)
    assert abs(half_ppl - dense_ppl) <= 0.001 * dense_ppl, (dense_ppl, half_ppl)
    assert "Paris" in canonical_answer(loaded, half)
