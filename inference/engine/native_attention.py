"""Attention as small C++ kernels, built at start by torch's extension loader: decode rows
(`decode_attention.cpp`) and prompt chunks (`chunk_attention.cpp`, docs/engine.md "Prompt
chunks in C++"), one module (`attention_bindings.cpp`).

Inductor's loops for `grouped_attention` are latency-bound on these CPUs: each score is a
64-wide dot product ended by a horizontal sum, and each output a single chain of
multiply-adds over the keys. On a 2-core Xeon with AMX (2026-12-03), 31 decode rows over a
bfloat16 cache took 13.4 / 45.1 / 76.5 / 131.5 ms a step of 30 layers over 64 / 320 / 576 /
1,024 keys, ~1 ms a layer with the keys already in cache: the decoders' own step doubled
from 55 to 102 ms as their histories grew from 72 to 307 keys during the head-of-line run.
The kernel keeps a (sequence, KV head)'s queries in registers, reads each key and value row
once for all of them, and runs the weighted sum on as many accumulators as there are query
heads: 6.6 / 26.5 / 46.0 / 79.6 ms, and at one row 1.24 against 2.09 ms for torch's fused
kernel (320 keys). It sums in one order whatever the rows, so a request's output is the same
alone and beside others, one row included. The chunk kernel puts a chunk's queries in a
vector's lanes instead: late in a long prompt (8 rows over 2,000 keys) it took half the fused
kernel's time, and a prompt comes out the same bits however it is cut. On a CPU with AMX a
bfloat16 cache of head_dim 32 or 64 takes the tile kernel (`chunk_tiles.cpp`): the
multiply-adds of scores and weighted sums in the matrix unit, 2.7x the vector kernel's speed
at 8 to 512 rows over 2,000 keys; same-bits property kept.

The module is built at start (`native_build.py`); where the build fails, or the cache's dtype
or head size does not fit, the runner keeps the compiled kernel
(`decode_attention.CompiledAttention`) for decode rows and torch's fused kernel for prompt
chunks, and says why once.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch

from inference.engine.decode_attention import Kernel
from inference.engine.kv_cache import KVSpec
from inference.engine.native_build import native_module

DTYPES = (torch.float32, torch.bfloat16)
TILE_HEAD_DIMS = (32, 64)  # a score tile's two or one steps over head_dim (chunk_tiles.cpp)
# (q [n, kv_heads, groups, head_dim], keys, values [kv_heads, keys, head_dim], start, scale):
# row r of a chunk at `start` attends keys 0 .. start + r (chunk_attention.cpp).
ChunkKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


def native_kernel(spec: KVSpec, groups: int) -> Kernel:
    """The built decode kernel for this cache, or an exception saying why there is none."""
    module = _checked(spec)
    if groups > module.max_groups:
        raise ValueError(f"{groups} query heads per KV head, the kernel takes {module.max_groups}")
    return module.decode_attention


def native_chunk_kernel(spec: KVSpec, tiles: bool = True) -> ChunkKernel:
    """The built prompt-chunk kernel for this cache: on AMX tiles where they take it and
    `tiles` allows, else in vectors; or an exception saying why there is none."""
    module = _checked(spec)
    if tiles and tiles_unfit(spec) is None:
        return module.chunk_attention_tiles
    return module.chunk_attention


def tiles_unfit(spec: KVSpec) -> str | None:
    """Why the AMX tile kernel does not take this cache here; None where it does."""
    if spec.dtype != torch.bfloat16 or spec.head_dim not in TILE_HEAD_DIMS:
        return f"the tiles take bfloat16, head_dim 32 or 64: {spec.dtype}, {spec.head_dim} here"
    if not native_module().tiles_ready():
        return "no AMX tiles on this CPU"
    return None


def _checked(spec: KVSpec) -> ModuleType:
    """The built module, where its kernels take this cache; else ValueError saying why."""
    if spec.device.type != "cpu":
        raise ValueError(f"the kernel is for the CPU, the cache is on {spec.device.type}")
    if spec.dtype not in DTYPES:
        raise ValueError(f"the kernel reads float32 or bfloat16, the cache is {spec.dtype}")
    module = native_module()
    width = module.vector_width
    if spec.head_dim % width or spec.head_dim > width * module.max_vectors:
        raise ValueError(
            f"head_dim {spec.head_dim}: the kernel takes multiples of {width} "
            f"up to {width * module.max_vectors}"
        )
    return module
