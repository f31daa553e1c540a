"""TANDEM_WEIGHTS=q4: GGUF Q4_1 read into torch's int4 format, kernel choice, fallbacks, quality."""

from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from bench.weights_quality import TEXT, perplexity
from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.kv_cache import KVCache
from inference.engine.weights import choice
from inference.engine.weights.choice import build_runner
from inference.engine.weights.layers import layer_linears
from inference.engine.weights.q4 import GGUF_PARTS, read_q4_1, unpermute_rows
from inference.provisioning import loading, model_source
from tests.engine.helpers import alone_and_together, sharpen, tiny_config

Q4_1 = gguf.GGMLQuantizationType.Q4_1
ALWAYS_INT4 = 1 << 20


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's rope permutation of Q/K rows (convert_hf_to_gguf.py)."""
    n = rows.shape[0]
    return (
        rows.reshape(heads, 2, n // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
    )


def q4_exact_gguf(model: PreTrainedModel, path: Path) -> Path:
    """Write the model's linears as a Q4_1 GGUF, llama.cpp's names and Q/K layout included.

    The model's own linears are set to the dequantized values, so the dense runner on the
    model and the q4 runner on the file hold the same weights.
    """
    config = model.config
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    writer = gguf.GGUFWriter(str(path), "llama")
    for index, layer in enumerate(model.model.layers):
        linears = layer_linears(layer)
        for fused, names in GGUF_PARTS.items():
            for name, linear in zip(names, linears[fused], strict=True):
                blocks = gguf.quants.quantize(linear.weight.detach().float().numpy(), Q4_1)
                exact = gguf.quants.dequantize(blocks, Q4_1)
                linear.weight.data = torch.from_numpy(exact).to(linear.weight.dtype)
                if name in heads:
                    blocks = np.ascontiguousarray(llama_cpp_permute(blocks, heads[name]))
                writer.add_tensor(f"blk.{index}.{name}.weight", blocks, raw_dtype=Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_q4(tmp_path: Path, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, Path]:
    """A tiny random Llama whose linears are Q4_1-exact, and its GGUF."""
    torch.manual_seed(0)
    model = sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config())))
    path = q4_exact_gguf(model, tmp_path / "tiny.Q4_1.gguf")
    return model.to(dtype), path


def test_q4_1_blocks_read_like_gguf_dequantizes() -> None:
    """Low nibbles are a block's first 16 weights, high nibbles its last 16; w = d·q + m."""
    values = np.random.default_rng(0).normal(size=(48, 96)).astype(np.float32)
    blocks = gguf.quants.quantize(values, Q4_1)
    matrix = read_q4_1(blocks)
    assert matrix.q.shape == (48, 96) and int(matrix.q.max()) <= 15
    expected = gguf.quants.dequantize(blocks, Q4_1)
    assert torch.equal(matrix.dequantize(), torch.from_numpy(expected))


def test_unpermute_rows_undoes_llama_cpp_permutation() -> None:
    rows = np.arange(96 * 3).reshape(96, 3)
    permuted = llama_cpp_permute(rows, heads=3)
    assert np.array_equal(permuted[unpermute_rows(96, 3).numpy()], rows)


def test_q4_runner_matches_dense_on_q4_exact_weights(tmp_path) -> None:
    """float32: the int4 kernel's logits are the dense model's to the rounding q4 adds (the
    kernel's bf16 rows and scales, the int8 head: ~2% of the logits' norm), on both
    packings, with the same next token. (Greedy continuations of this random model part
    from HF's within a few tokens: its logits are chaotic, see the invariance test.)"""
    model, path = tiny_q4(tmp_path)
    prompt = list(range(200, 240))
    expected = model(torch.tensor([prompt])).logits[0, -1]
    for max_rows in (ALWAYS_INT4, 0):
        runner = build_runner(model, "q4", path, max_rows=max_rows)
        assert runner.weights == "q4"
        cache = KVCache(runner.kv_spec, 1, 64)
        slot = cache.allocate()
        cache.extend(slot, len(prompt))
        batch = StepBatch(chunks=[PrefillChunk(slot, 0, prompt, needs_logits=True)])
        with torch.inference_mode():
            logits = runner.forward(batch, cache)[0]
        error = (logits - expected.detach()).norm() / expected.norm()
        assert error < 0.05, (max_rows, float(error))
        assert int(logits.argmax()) == int(expected.argmax())


@pytest.mark.parametrize("max_rows", [ALWAYS_INT4, 0], ids=["int4-kernel", "dense-packing"])
def test_q4_batch_invariance(tmp_path, tokenizer, make_engine, max_rows) -> None:
    """bf16: a request's tokens do not depend on its companions, on either kernel.

    Across the switch between them (a step's rows crossing the measured limit) they may: the two
    kernels round differently (docs/engine.md, "Weight formats").
    """
    model, path = tiny_q4(tmp_path, torch.bfloat16)
    runner = build_runner(model, "q4", path, max_rows=max_rows)
    engine = make_engine(model, tokenizer, runner=runner, max_running=8, max_step_tokens=64)
    alone, together = alone_and_together(engine, 5, range(3, 43, 5), 8, 3)
    assert together == alone


def test_fallbacks_to_dense_are_logged_once(tmp_path, monkeypatch, caplog) -> None:
    model, path = tiny_q4(tmp_path)
    with caplog.at_level(logging.INFO, logger=choice.__name__):
        assert build_runner(model, "q4", None).weights == "bf16"
        monkeypatch.setattr(choice, "int4_kernel_missing", lambda: "no int4 kernel (test)")
        assert build_runner(model, "q4", path).weights == "bf16"
        half = model.to(torch.float16)  # int8 takes bf16 rows (from bf16 or float32 models)
        assert build_runner(half, "auto", path).weights == "bf16"
        assert build_runner(half, "int8", path).weights == "bf16"
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == choice.__name__]
    assert len(messages) == 4
    assert messages[0][0] == logging.WARNING and "not the packaged GGUF" in messages[0][1]
    assert messages[1][0] == logging.WARNING and "no int4 kernel (test)" in messages[1][1]
    assert messages[2][0] == logging.INFO and "bfloat16 activations" in messages[2][1]
    assert messages[3][0] == logging.WARNING and "bfloat16 activations" in messages[3][1]
    assert build_runner(model, "bf16", path).weights == "bf16"
    with pytest.raises(ValueError, match="TANDEM_WEIGHTS must be one of"):
        build_runner(model, "int3", path)


def test_a_gguf_that_does_not_fit_falls_back(tmp_path, caplog) -> None:
    _, path = tiny_q4(tmp_path)
    torch.manual_seed(0)
    other = LlamaForCausalLM(LlamaConfig(**tiny_config(intermediate_size=256)))
    with caplog.at_level(logging.WARNING, logger=choice.__name__):
        assert build_runner(other, "q4", path).weights == "bf16"
    assert "does not fit the model" in caplog.text


@pytest.mark.model
@pytest.mark.timeout(900)
def test_packaged_q4_perplexity_within_one_percent_of_bf16() -> None:
    """SmolLM2 on tests/data/perplexity.txt, every position on the int4 kernel (the int8
    head), in the dtype this CPU runs it in."""
    missing = choice.int4_kernel_missing()
    if missing:
        pytest.skip(missing)
    loaded = loading.load(None, "auto")
    gguf_path = model_source.packaged_gguf()
    q4 = build_runner(loaded.model, "q4", gguf_path, max_rows=ALWAYS_INT4)
    assert q4.weights == "q4"
    dense = build_runner(loaded.model, "bf16", gguf_path)
    ids = loaded.tokenizer(TEXT.read_text())["input_ids"]
    assert len(ids) > 300
    bf16_ppl, q4_ppl = perplexity(dense, ids), perplexity(q4, ids)
    assert abs(q4_ppl - bf16_ppl) <= 0.01 * bf16_ppl, (bf16_ppl, q4_ppl)
