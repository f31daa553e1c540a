"""TANDEM_WEIGHTS=int8: per-row int8 of the dense weights on torch's int8 kernel; quality."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.weights_quality import TEXT, perplexity
from inference.engine import Engine, SamplingParams
from inference.engine.weights import choice
from inference.engine.weights.choice import build_runner
from inference.engine.weights.projection import Projection
from inference.provisioning import loading
from inference.provisioning.prompting import chat_prompt_ids
from tests.engine.helpers import WAIT, alone_and_together, sharpen, tiny_config

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


def test_auto_is_int8_for_a_bfloat16_model_on_the_cpu() -> None:
    if choice.int8_missing(tiny_bf16()) is not None:
        pytest.skip(choice.int8_missing(tiny_bf16()))
    assert build_runner(tiny_bf16(), "auto", None).weights == "int8"


@pytest.mark.model
@pytest.mark.timeout(900)
def test_packaged_int8_quality() -> None:
    """SmolLM2 in int8: perplexity within 1% of bf16's, and the canonical greedy answer."""
    loaded = loading.load(None, "bfloat16")
    if choice.int8_missing(loaded.model):
        pytest.skip(choice.int8_missing(loaded.model))
    int8 = build_runner(loaded.model, "int8", None, max_rows=ALWAYS_INT8)
    dense = build_runner(loaded.model, "bf16", None)
    ids = loaded.tokenizer(TEXT.read_text())["input_ids"]
    bf16_ppl, int8_ppl = perplexity(dense, ids), perplexity(int8, ids)
    assert abs(int8_ppl - bf16_ppl) <= 0.01 * bf16_ppl, (bf16_ppl, int8_ppl)
    engine = Engine(loaded.model, loaded.tokenizer, runner=int8).start()
    try:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        prompt = chat_prompt_ids(loaded.tokenizer, messages)
        result = engine.generate_batch([(None, prompt, SamplingParams(max_new_tokens=16))], WAIT)
    finally:
        engine.shutdown()
    assert "Paris" in result[0].text
