"""The C++ attention kernels: decode rows as grouped attention, the same bits for a row
whatever its companions or the view's length; prompt chunks as causal attention, in vectors
and on AMX tiles (where this CPU has them), the same bits however a prompt is cut; their
limits said, and the runner's fallback to the compiled kernel where they cannot be built."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import inference.engine.model_runner as model_runner
from inference.engine import SamplingParams
from inference.engine.decode_attention import grouped_attention
from inference.engine.kv_cache import KVSpec
from inference.engine.model_runner import LlamaRunner
from inference.engine.native_attention import native_chunk_kernel, native_kernel, tiles_unfit
from inference.engine.native_build import native_module
from tests.engine.helpers import WAIT, sharpen, tiny_config

CPU = torch.device("cpu")
KV_HEADS, GROUPS = 3, 3


def spec(dtype: torch.dtype, head_dim: int = 64) -> KVSpec:
    return KVSpec(num_layers=1, num_kv_heads=KV_HEADS, head_dim=head_dim, dtype=dtype, device=CPU)


def case(dtype: torch.dtype, rows: int, head_dim: int = 64, capacity: int = 160):
    """Queries, a slot cache's keys and values, and each row's own length as a mask."""
    generator = torch.Generator().manual_seed(rows * head_dim)
    cache = torch.randn(2, rows, KV_HEADS, capacity, head_dim, generator=generator).to(dtype)
    q = torch.randn(rows, KV_HEADS, GROUPS, head_dim, generator=generator).to(dtype)
    lengths = torch.randint(1, capacity - 40, (rows,), generator=generator)
    return q, cache, lengths


def mask_for(lengths: torch.Tensor, keys: int, dtype: torch.dtype) -> torch.Tensor:
    visible = torch.arange(keys)[None, :] < lengths[:, None]
    mask = torch.zeros(len(lengths), 1, 1, keys, dtype=dtype)
    return mask.masked_fill_(~visible[:, None, None, :], float("-inf"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_matches_grouped_attention(dtype: torch.dtype, head_dim: int) -> None:
    """16: one vector of floats on AVX-512, the odd case of the bfloat16 loads."""
    kernel = native_kernel(spec(dtype, head_dim), GROUPS)
    q, cache, lengths = case(dtype, 7, head_dim)
    keys = int(lengths.max())
    k, v = cache[0, :, :, :keys], cache[1, :, :, :keys]
    mask = mask_for(lengths, keys, dtype)
    got = kernel(q, k, v, mask, head_dim**-0.5)
    want = grouped_attention(q, k, v, mask, head_dim**-0.5)
    assert got.dtype == dtype and got.shape == want.shape
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_the_same_alone_beside_others_and_over_a_longer_view(dtype: torch.dtype) -> None:
    kernel = native_kernel(spec(dtype), GROUPS)
    q, cache, lengths = case(dtype, 9)
    keys = int(lengths.max())
    together = kernel(
        q, cache[0, :, :, :keys], cache[1, :, :, :keys], mask_for(lengths, keys, dtype), 0.125
    )
    longer = keys + 37
    wider = kernel(
        q, cache[0, :, :, :longer], cache[1, :, :, :longer], mask_for(lengths, longer, dtype), 0.125
    )
    assert torch.equal(together, wider)
    for row in (0, 4, 8):
        own = int(lengths[row])
        alone = kernel(
            q[row : row + 1].contiguous(),
            cache[0, row : row + 1, :, :own],
            cache[1, row : row + 1, :, :own],
            mask_for(lengths[row : row + 1], own, dtype),
            0.125,
        )
        assert torch.equal(alone[0], together[row]), row


def prompt_case(dtype: torch.dtype, rows: int, head_dim: int = 64, capacity: int = 200):
    """A chunk's queries, and one slot's keys and values [kv_heads, capacity, head_dim]."""
    generator = torch.Generator().manual_seed(rows + head_dim)
    q = torch.randn(rows, KV_HEADS, GROUPS, head_dim, generator=generator).to(dtype)
    cache = torch.randn(2, KV_HEADS, capacity, head_dim, generator=generator).to(dtype)
    return q, cache[0], cache[1]


def causal_attention(q, keys, values, start: int, scale: float) -> torch.Tensor:
    """Row r of a chunk at `start` over keys 0 .. start + r, in float32."""
    rows = q.shape[0]
    k, v = keys[:, : start + rows].float(), values[:, : start + rows].float()
    scores = torch.einsum("rhgd,hld->rhgl", q.float(), k) * scale
    seen = torch.arange(start + rows)[None, :] <= torch.arange(start, start + rows)[:, None]
    scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
    return torch.einsum("rhgl,hld->rhgd", scores.softmax(-1), v)


def chunk_kernel(kind: str, dtype: torch.dtype, head_dim: int = 64):
    """The vector kernel, or the tile kernel (skipped where it does not take the cache)."""
    cache = spec(dtype, head_dim)
    if kind == "tiles":
        reason = tiles_unfit(cache)
        if reason:
            pytest.skip(reason)
    return native_chunk_kernel(cache, tiles=kind == "tiles")


@pytest.mark.parametrize("kind", ["vector", "tiles"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize(("rows", "start"), [(1, 0), (7, 0), (8, 53), (40, 100), (6, 150)])
def test_a_chunk_matches_causal_attention(kind, dtype, head_dim, rows, start) -> None:
    """40 rows x 3 query heads: several tiles of queries, the last one partly empty; 6 rows
    at 150: the chunk's keys end at the cache's last row (156 of 156), mid-tile."""
    kernel = chunk_kernel(kind, dtype, head_dim)
    q, keys, values = prompt_case(dtype, rows, head_dim, capacity=156 if start == 150 else 200)
    got = kernel(q, keys, values, start, head_dim**-0.5)
    want = causal_attention(q, keys, values, start, head_dim**-0.5)
    assert got.dtype == dtype and got.shape == q.shape
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("kind", ["vector", "tiles"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_is_the_same_bits_however_it_is_cut(kind: str, dtype: torch.dtype) -> None:
    kernel = chunk_kernel(kind, dtype)
    q, keys, values = prompt_case(dtype, 64)
    whole = kernel(q, keys, values, 30, 0.125)
    cuts = [(0, 13), (13, 40), (40, 41), (41, 64)]
    pieces = [kernel(q[a:b].contiguous(), keys, values, 30 + a, 0.125) for a, b in cuts]
    assert torch.equal(torch.cat(pieces), whole)
    shorter = kernel(q, keys[:, :94].contiguous(), values[:, :94].contiguous(), 30, 0.125)
    assert torch.equal(shorter, whole)


def test_what_it_does_not_take_is_said() -> None:
    with pytest.raises(ValueError, match="float16"):
        native_kernel(spec(torch.float16), GROUPS)
    with pytest.raises(ValueError, match="float16"):
        native_chunk_kernel(spec(torch.float16))
    with pytest.raises(ValueError, match="head_dim 12"):
        native_kernel(spec(torch.float32, head_dim=12), GROUPS)
    with pytest.raises(ValueError, match="query heads per KV head"):
        native_kernel(spec(torch.float32), 64)
    assert "float32" in tiles_unfit(spec(torch.float32))
    assert "16" in tiles_unfit(spec(torch.bfloat16, head_dim=16))
    q, keys, values = prompt_case(torch.float32, 4)
    with pytest.raises(RuntimeError, match="bfloat16|no AMX tiles"):
        native_module().chunk_attention_tiles(q, keys, values, 0, 0.125)


def test_a_bfloat16_cache_takes_the_tiles_where_the_cpu_has_them() -> None:
    """Where AMX is (cpuinfo's amx_bf16), a bfloat16 cache at head_dim 64 gets the tile kernel;
    elsewhere the vector kernel, and why."""
    module, cache = native_module(), spec(torch.bfloat16)
    has_tiles = "amx_bf16" in Path("/proc/cpuinfo").read_text()
    assert module.tiles_ready() == has_tiles
    want = module.chunk_attention_tiles if has_tiles else module.chunk_attention
    assert native_chunk_kernel(cache) == want
    assert native_chunk_kernel(cache, tiles=False) == module.chunk_attention
    assert tiles_unfit(cache) == (None if has_tiles else "no AMX tiles on this CPU")


def tiny_runner() -> LlamaRunner:
    torch.manual_seed(3)
    return LlamaRunner(sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config()))))


def test_the_compiled_step_attends_with_it() -> None:
    runner = tiny_runner()
    assert runner.attention_kind == "fused"
    runner.compile_decode((1, 2)).join()
    assert runner.compile_state == "ready"
    assert runner.attention_kind == "native"
    assert runner.chunk_kernel is not None


def test_a_long_prompt_comes_out_the_same_in_chunks_on_it(tokenizer, make_engine) -> None:
    """Fed 512 tokens a step or 16, a 300-token prompt's greedy tokens are the same."""
    runner = tiny_runner()
    runner.compile_decode((1, 2)).join()
    assert runner.chunk_kernel is not None
    prompt = torch.randint(100, 49152, (300,), generator=torch.Generator().manual_seed(5))
    request = [(None, prompt.tolist(), SamplingParams(max_new_tokens=16, ignore_eos=True))]
    outputs = []
    for step_tokens in (512, 16):
        engine = make_engine(
            runner.model, tokenizer, runner=runner, max_step_tokens=step_tokens, max_running=2
        )
        outputs.append(engine.generate_batch(request, WAIT)[0].token_ids)
        engine.shutdown()
    assert outputs[0] == outputs[1]


def test_without_a_build_the_compiled_kernel_attends_said_once(monkeypatch, caplog) -> None:
    """A machine without a compiler cannot be made here for real: the build's fault is raised."""

    def no_compiler(*args: object) -> None:
        raise RuntimeError("Error building extension 'tandem_native'")

    monkeypatch.setattr(model_runner, "native_kernel", no_compiler)
    runner = tiny_runner()
    with caplog.at_level(logging.WARNING, logger=model_runner.__name__):
        runner.compile_decode((1, 2)).join()
    assert runner.compile_state == "ready"
    assert runner.attention_kind == "compiled"
    assert runner.chunk_kernel is None
    said = [r.getMessage() for r in caplog.records]
    said = [message for message in said if "native attention unavailable" in message]
    assert len(said) == 1 and "Error building extension" in said[0]
