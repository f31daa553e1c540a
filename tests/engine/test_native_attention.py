"""The C++ decode attention kernel: grouped attention's results, the same bits for a row
whatever its companions or the view's length, its limits said, and the runner's fallback to
the compiled kernel where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import inference.engine.model_runner as model_runner
from inference.engine.decode_attention import grouped_attention
from inference.engine.kv_cache import KVSpec
from inference.engine.model_runner import LlamaRunner
from inference.engine.native_attention import native_kernel
from tests.engine.helpers import sharpen, tiny_config

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


def test_what_it_does_not_take_is_said() -> None:
    with pytest.raises(ValueError, match="float16"):
        native_kernel(spec(torch.float16), GROUPS)
    with pytest.raises(ValueError, match="head_dim 12"):
        native_kernel(spec(torch.float32, head_dim=12), GROUPS)
    with pytest.raises(ValueError, match="query heads per KV head"):
        native_kernel(spec(torch.float32), 64)


def tiny_runner() -> LlamaRunner:
    torch.manual_seed(3)
    return LlamaRunner(sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config()))))


def test_the_compiled_step_attends_with_it() -> None:
    runner = tiny_runner()
    assert runner.attention_kind == "fused"
    runner.compile_decode((1, 2)).join()
    assert runner.compile_state == "ready"
    assert runner.attention_kind == "native"


def test_without_a_build_the_compiled_kernel_attends_said_once(monkeypatch, caplog) -> None:
    """A machine without a compiler cannot be made here for real: the build's fault is raised."""

    def no_compiler(*args: object) -> None:
        raise RuntimeError("Error building extension 'tandem_decode_attention'")

    monkeypatch.setattr(model_runner, "native_kernel", no_compiler)
    runner = tiny_runner()
    with caplog.at_level(logging.WARNING, logger=model_runner.__name__):
        runner.compile_decode((1, 2)).join()
    assert runner.compile_state == "ready"
    assert runner.attention_kind == "compiled"
    said = [r.getMessage() for r in caplog.records if "native decode attention" in r.getMessage()]
    assert len(said) == 1 and "Error building extension" in said[0]
