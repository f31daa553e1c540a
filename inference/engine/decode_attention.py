"""Decode attention: one query group per sequence over its cached keys, as inductor's loops.

Decode rows are `n` sequences x `kv_heads` x `groups` queries (the query heads sharing a KV
head), each over its own L cached keys. torch's fused CPU attention treats every (sequence,
KV head) as a separate small problem: two GEMM calls of 3 rows each, 93 pairs a layer at 31
decoders, so it reads the cache at a fraction of memory speed. Over the engine's own cache
(every layer's K/V cold in memory, 4 KiB pages) 31 rows cost, per step of 30 layers, 12.8 /
24.9 / 39.4 / 61.9 ms over 64 / 160 / 320 / 576 keys in float32 (2-core AMD EPYC with
AVX-512 BF16, 2026-12-02); the same arithmetic written as broadcasts and sums, compiled by
inductor with the key count dynamic, runs as generated loops: 10.0 / 15.5 / 26.9 / 45.4 ms in
float32 and 7.9 / 15.2 / 24.8 / 40.1 ms over a bfloat16 cache (half the bytes), which is
why the CPU cache keeps the model's dtype.

The sums run in float32 whatever the cache's dtype. Each query's dot products run over
head_dim and its weighted sum over the keys in key order, so a row's output does not depend
on how many rows or keys the call has (masked keys add exact zeros): batch invariance holds
bit for bit among calls of two rows or more. A single row takes torch's fused kernel
(`CompiledAttention`), which sums in another order: a request alone and the same request
beside others can differ in the last bits, as they already do where the weights' kernel
follows the step's row count (docs/engine.md, "Batch invariance").

Where the C++ kernel builds (`native_attention.py`: the same arithmetic without inductor's
latency-bound loops, 1.6-2x faster on a Xeon with AMX) it takes this one's place; the
compiled kernel is its fallback.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx.experimental import _config as shape_config
from torch.nn.functional import scaled_dot_product_attention

from inference.engine.kv_cache import KVCache, KVSpec

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
# Shapes a compiled kernel is warmed on: several rows (one row never reaches it), keys
# gathered (other strides) and read through the cache view. Each call checks the compiled
# variants newest first, so the commonest (rows through the view) comes last.
WARM_ROWS = (2,)
WARM_KEYS = 96


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [n, kv_heads, groups, dim] over k, v [n, kv_heads, L, dim] with an additive mask
    [n, 1, 1, L]; float32 sums, the result in q's dtype."""
    scores = (q[:, :, :, None, :].float() * k[:, :, None, :, :].float()).sum(-1)
    weights = torch.softmax(scores * scale + mask.float(), dim=-1)
    return (weights[..., None] * v[:, :, None, :, :].float()).sum(-2).to(q.dtype)


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """torch's fused attention kernel: the eager steps' (before the compiled step is ready,
    or where it failed)."""
    return scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def kernel_for_rows(kernel: Kernel, rows: int) -> Kernel:
    """The function a call of `rows` rows ends in, for a step that knows its rows and calls
    it 30 times (`CompiledAttention.for_rows`; any other kernel is itself)."""
    return kernel.for_rows(rows) if isinstance(kernel, CompiledAttention) else kernel


class CompiledAttention:
    """`grouped_attention` compiled with dynamic shapes, warmed on every shape a step meets;
    one row goes to torch's fused kernel.

    Steps run under "fail_on_recompile", so a shape or layout not warmed here would fail the
    step's graph and leave the runner eager for good (said once), as the decode graph would.
    A compiled call first checks its guards, ~50 µs: at one row (a single stream, or a long
    outlier attended apart) that cost more than the kernel saves (10.7 against 9.2 ms a
    30-layer step at 64 keys, 11.6 against 10.9 at 576), so one row takes the fused kernel.
    """

    def __init__(self, groups: int) -> None:
        self.groups = groups
        self.kernel = torch.compile(grouped_attention, dynamic=True, fullgraph=True)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        return self.for_rows(q.shape[0])(q, k, v, mask, scale)

    def for_rows(self, rows: int) -> Kernel:
        """The fused kernel for one row, the compiled one for more."""
        return fused_attention if rows == 1 else self.kernel

    def warm(self, spec: KVSpec, scale: float) -> None:
        """Compile the kernel for every shape and layout of WARM_ROWS, on a scratch cache
        made as the engine makes its own: outside inference mode (torch tells the two kinds
        of tensor apart) and with room past the keys read (a view as long as its slot is
        contiguous, and the graph would assume it)."""
        with torch.inference_mode(False):
            layer = KVCache(spec, max(WARM_ROWS), 2 * WARM_KEYS).layer(0)
        keys, values = layer[0], layer[1]
        for rows in WARM_ROWS:
            q = keys.new_zeros(rows, spec.num_kv_heads, self.groups, spec.head_dim)
            mask = keys.new_zeros(rows, 1, 1, WARM_KEYS)
            picked = torch.arange(rows, device=keys.device)
            view = keys[:rows, :, :WARM_KEYS], values[:rows, :, :WARM_KEYS]
            gathered = tuple(t[:, :, :WARM_KEYS].index_select(0, picked) for t in (keys, values))
            for k, v in (gathered, view):
                # Sizes that happen to be equal here (keys and head_dim, say) keep separate
                # symbols: tied, the first step that parts them would need another graph.
                with shape_config.patch(use_duck_shape=False):
                    self(q, k, v, mask, scale)
