"""The model runner: one forward pass over a step's tokens, reading and writing the KV cache.

The runner reuses the HF model's own modules (norms, activation, rotary embedding, lm_head),
so dtype and device are whatever the loaded model has; its projections are the model's
linears fused (QKV, gate/up) or, with TANDEM_WEIGHTS=q4, the GGUF's 4-bit ones
(`inference/engine/weights`). It replaces the attention and cache plumbing. All tokens of a
step (decode tokens and prefill chunks) go through the linear layers as one [tokens, hidden]
matrix; attention is split: one batched grouped matmul over the compacted cache view for
decode tokens (long outliers gathered and attended apart), and one causal attention per
prefill chunk. Logits are computed only for rows that pick a token.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers import PretrainedConfig, PreTrainedModel

from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.compiled_decode import (
    BUCKETS,
    CompiledDecode,
    DecodeModel,
    StepPlan,
    run_stack,
)
from inference.engine.decode_attention import (
    CompiledAttention,
    Kernel,
    fused_attention,
    kernel_for_rows,
)
from inference.engine.errors import StepInterrupted, UnsupportedModel
from inference.engine.kv_cache import KVCache, KVSpec
from inference.engine.native_attention import (
    ChunkKernel,
    native_chunk_kernel,
    native_kernel,
    tiles_unfit,
)
from inference.engine.openmp import release_thread_pool
from inference.engine.scheduler import MIN_CHUNK
from inference.engine.step_attention import ViewStep, is_native_kernel
from inference.engine.timing import fastest_seconds
from inference.engine.weights.layers import LayerProjections, dense_projection, layer_linears
from inference.engine.weights.projection import Projection

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")
LONG_ROW = 256
KEY_BLOCK = 32
# The chunk-attention probe (`chunk_key_seconds`): a chunk of the scheduler's floor
# (MIN_CHUNK), attending from position 0 and from KEY_PROBE (or as far as the context
# allows), fastest of PROBE_RUNS.
KEY_PROBE = 1024
PROBE_RUNS = 5


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Decode rows attended together: through a cache view, or gathered by slot.

    `rows` picks the group's rows among the step's decode rows (None: all, in order).
    A view group reads K[:span, :, :longest], its rows sitting at `scatter` (None: 0..n-1);
    a gather group reads the slots in `gather`. `visible` is 0 up to each row's length and
    -inf beyond (SDPA's additive mask); `longest` is the longest row rounded up to KEY_BLOCK
    (see `key_extent`).
    """

    rows: torch.Tensor | None
    span: int
    longest: int
    visible: torch.Tensor
    scatter: torch.Tensor | None
    gather: torch.Tensor | None


class ModelRunner(Protocol):
    """What the engine needs from a runner; tests inject their own (fakes, fault injection)."""

    kv_spec: KVSpec
    vocab_size: int
    context_length: int

    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """Run one step; return float32 logits [rows, vocab] in `batch.samplers` order."""
        ...


def runner_for(model: PreTrainedModel) -> ModelRunner:
    """The runner for a loaded model, or UnsupportedModel naming what is supported."""
    return LlamaRunner(model)


class LlamaRunner:
    """Runs Llama-layout decoder models (Llama, Mistral, Qwen2) over the slot KV cache."""

    def __init__(
        self,
        model: PreTrainedModel,
        projections: list[LayerProjections] | None = None,
        weights: str = "bf16",
        head: Projection | None = None,
    ) -> None:
        """`projections` replace the model's linears (q4, int8); by default they are its own,
        fused. `head` replaces its lm_head (int8); by default the model's own module runs."""
        name = type(model).__name__
        if name not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModel(
                f"{name} is not supported by the engine; supported architectures: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}."
            )
        config = model.config
        rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope_type in DYNAMIC_ROPE_TYPES:
            raise UnsupportedModel(
                f"rope_type {rope_type!r} rescales positions per batch, which would make a "
                "request's output depend on its batch companions; it is not supported."
            )
        self.model = model
        self.layers = list(model.model.layers)
        self.weights = weights
        self.compiled: CompiledDecode | None = None
        self.attention: Kernel = fused_attention
        self.chunk_kernel: ChunkKernel | None = None  # the C++ one, once built; else SDPA
        self.compile_state = "off"
        self.compile_seconds: dict[int, float] = {}
        self.projections = projections or [self.dense_layer(layer) for layer in self.layers]
        self.head = head
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.scaling = attention.scaling
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.groups = self.num_heads // self.num_kv_heads
        self.vocab_size = config.vocab_size
        self.context_length = self._context_length(config)
        parameter = next(model.parameters())
        self.kv_spec = KVSpec(
            num_layers=len(self.layers),
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=parameter.dtype,
            device=parameter.device,
        )
        self.qkv_sizes = [
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        ]
        self.stack = DecodeModel(self).eval()

    @staticmethod
    def dense_layer(layer: torch.nn.Module) -> LayerProjections:
        """The layer's own linears, fused."""
        linears = layer_linears(layer)
        return LayerProjections(**{name: dense_projection(mods) for name, mods in linears.items()})

    @staticmethod
    def _context_length(config: PretrainedConfig) -> int:
        """Positions the model attends over; a sliding window caps it so full attention is exact."""
        length = config.max_position_embeddings
        layer_types = getattr(config, "layer_types", None) or []
        window = getattr(config, "sliding_window", None)
        if window and (not layer_types or "sliding_attention" in layer_types):
            length = min(length, window)
        return length

    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """Feed the step's tokens through every layer; logits only for sampling rows.

        With the compiled step ready, a step whose rows (decode tokens and prompt chunks
        together) fit its largest bucket runs through it, attention included as the same
        per-layer function the eager pass calls; bigger steps (long prompts) run eagerly.
        """
        step = self._step_plan(batch, cache)
        compiled = self.compiled
        if compiled is not None and compiled.fits(len(step.token_ids), len(step.logit_rows)):
            try:
                return compiled.run(step)
            except StepInterrupted:
                raise
            except Exception as exc:  # any compiler fault: this step and the rest run eagerly
                self._compile_failed(exc)
        return run_stack(self.stack, step, len(step.token_ids), len(step.logit_rows))

    def _step_plan(
        self, batch: StepBatch, cache: KVCache, attention: Kernel | None = None
    ) -> StepPlan:
        """The step's rows in order (decode tokens, then each chunk's), and their attention
        (decode rows on `attention`, by default the runner's kernel)."""
        kernel = attention or self.attention
        device = self.kv_spec.device
        token_ids = list(batch.decode_token_ids)
        slots = list(batch.decode_slots)
        positions = list(batch.decode_positions)
        logit_rows = list(range(len(batch.decode_slots)))
        for chunk in batch.chunks:
            token_ids.extend(chunk.token_ids)
            slots.extend([chunk.slot] * len(chunk.token_ids))
            positions.extend(range(chunk.start, chunk.start + len(chunk.token_ids)))
            if chunk.needs_logits:
                logit_rows.append(len(token_ids) - 1)
        cache_rows = self._cache_rows(slots, torch.tensor(positions, device=device), cache)
        decode = self._decode_plan(batch, cache)
        chunk_kernel, capacity = self.chunk_kernel, cache.capacity
        chunk_visible = [
            None if chunk_kernel else self._causal_visible(c.start, len(c.token_ids), capacity)
            for c in batch.chunks
        ]
        decoders = len(batch.decode_slots)
        lone = decode[0] if len(decode) == 1 and not batch.chunks else None
        if lone is not None and lone.rows is None and lone.scatter is None:
            view = self._view_attend(cache, cache_rows, lone, kernel)
            native = self._view_step(cache, cache_rows, lone) if is_native_kernel(kernel) else None
            return StepPlan(
                token_ids,
                positions,
                logit_rows,
                view,
                device,
                batch.interrupt,
                batch.arrivals,
                native,
            )

        def attend(q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
            """Write the rows' K/V into the cache, then attend: [rows, heads * head_dim]."""
            stored = cache.layer(layer)
            rows = kv.view(-1, self.head_dim).to(stored.dtype)
            stored.view(-1, self.head_dim).index_copy_(0, cache_rows, rows)
            keys, values = stored[0], stored[1]
            dtype = q.dtype
            q = q.reshape(q.shape[0], -1).to(stored.dtype)
            parts = (
                [self._decode_attention(q[:decoders], keys, values, decode, kernel)]
                if decode
                else []
            )
            offset = decoders
            for chunk, visible in zip(batch.chunks, chunk_visible, strict=True):
                size = len(chunk.token_ids)
                part = q[offset : offset + size]
                parts.append(
                    self._chunk_attention(part, keys, values, chunk, visible, chunk_kernel)
                )
                offset += size
            return (parts[0] if len(parts) == 1 else torch.cat(parts)).to(dtype)

        return StepPlan(
            token_ids, positions, logit_rows, attend, device, batch.interrupt, batch.arrivals
        )

    def _view_attend(
        self, cache: KVCache, cache_rows: torch.Tensor, group: DecodeGroup, kernel: Kernel
    ) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]:
        """`attend` for the commonest step (decode rows only, in slots 0..n-1, read through
        one view) with what every layer shares worked out once. Beyond the kernel's own time
        the general `attend` took ~40 µs a layer, this one ~15, 30 times a step (one row, 300
        keys; docs/engine.md, "Attention stays the runner's")."""
        head_dim, dtype = self.head_dim, cache.storage.dtype
        span, longest, mask, scale = group.span, group.longest, group.visible, self.scaling
        shape = (span, self.num_kv_heads, self.groups, head_dim)
        width = self.num_heads * head_dim
        kernel = kernel_for_rows(kernel, span)

        def attend(q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
            stored = cache.layer(layer)
            model_dtype = q.dtype
            if model_dtype != dtype:
                q, kv = q.to(dtype), kv.to(dtype)
            stored.view(-1, head_dim).index_copy_(0, cache_rows, kv.view(-1, head_dim))
            keys, values = stored[0, :span, :, :longest], stored[1, :span, :, :longest]
            out = kernel(q.view(shape), keys, values, mask, scale).reshape(span, width)
            return out if model_dtype == dtype else out.to(model_dtype)

        return attend

    def _view_step(self, cache: KVCache, cache_rows: torch.Tensor, group: DecodeGroup) -> ViewStep:
        """What the step's C++ attention op needs to do `_view_attend`'s work itself."""
        return ViewStep(
            cache.storage,
            cache_rows,
            group.visible,
            group.span,
            group.longest,
            self.groups,
            self.scaling,
        )

    def compile_decode(
        self, buckets: tuple[int, ...] = BUCKETS, cache_dir: Path | None = None
    ) -> threading.Thread:
        """Load or build the compiled step's buckets in a background thread (from and into
        `cache_dir`, compile_cache.py); steps run eagerly until their bucket is there.

        The graphs are timed on a scratch cache, so the engine's own cache is never touched
        from this thread; `compiled` is set (one attribute store) before the first bucket,
        which serves steps as soon as it is loaded.
        The caller's OpenMP workers (left by loading the model) are released first, as
        `Engine.start` does: beside them the build thread's kernels ran at about half speed,
        and the warm-up's step times, which seed the prefill pacer, read so (a one-row step
        33.9 ms against ~16 in the engine, 2-core Xeon with AMX).
        """
        release_thread_pool()
        self.compile_state = "warming"

        def build() -> None:
            try:
                with torch.inference_mode():
                    attention = self._native_attention() or self._compiled_attention()
                    compiled = CompiledDecode(self, buckets, cache_dir)
                    self.compiled = compiled
                    compiled.warm(partial(self._step_plan, attention=attention))
            except Exception as exc:  # any compiler fault leaves the engine eager, said once
                self._compile_failed(exc)
                return
            self.compile_seconds = compiled.warm_seconds
            self.attention = attention
            self.compile_state = "ready"

        thread = threading.Thread(target=build, name="tandem-compile", daemon=True)
        thread.start()
        return thread

    @property
    def compile_buckets(self) -> dict[int, dict[str, object]]:
        """Each compiled bucket's state and seconds (`/health`); empty without a compiled
        step."""
        compiled = self.compiled
        return compiled.status() if compiled is not None else {}

    @property
    def attention_kind(self) -> str:
        """Which decode attention the steps use (`/health`): native, compiled or fused."""
        if isinstance(self.attention, CompiledAttention):
            return "compiled"
        return "fused" if self.attention is fused_attention else "native"

    @property
    def chunk_kind(self) -> str:
        """Which prompt-chunk attention the steps use (`/health`, the bench): tiles (AMX),
        vector or sdpa (torch's fused kernel, where the C++ module is not built)."""
        if self.chunk_kernel is None:
            return "sdpa"
        return "vector" if tiles_unfit(self.kv_spec) else "tiles"

    def _native_attention(self) -> Kernel | None:
        """The C++ decode attention kernel (native_attention.py), in use from now on, eager
        steps included, and its prompt-chunk kernel with it; None where they cannot be had,
        said once."""
        try:
            kernel = native_kernel(self.kv_spec, self.groups)
            self.chunk_kernel = native_chunk_kernel(self.kv_spec)
        except Exception as exc:  # no compiler, no ninja, a cache it does not take
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            log.warning(
                "native attention unavailable (decode rows compiled instead, prompt chunks on "
                "torch's fused kernel): %s",
                reason,
            )
            return None
        self.attention = kernel
        return kernel

    def _compiled_attention(self) -> Kernel:
        """`grouped_attention` compiled by inductor and warmed on every shape a step meets."""
        attention = CompiledAttention(self.groups)
        attention.warm(self.kv_spec, self.scaling)
        return attention

    def _compile_failed(self, exc: Exception) -> None:
        """Fall back to the eager step for good, with one log line saying why."""
        self.compiled = None
        if isinstance(self.attention, CompiledAttention):  # the C++ kernel stays
            self.attention = fused_attention
        self.compile_state = f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        log.warning("compiled decode unavailable, running eagerly: %s", self.compile_state)

    def _cache_rows(
        self, slots: list[int], positions: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Row of every (token, K or V, kv head) in a layer's cache seen as
        [2 * slots * heads * capacity, dim], in the order of the rows' `kv` ([rows, 2, heads,
        dim]: keys, then values).

        One `index_copy_` per layer then writes the step's K and V: a plain row copy, where
        indexing by (slot, position) pairs costs an index_put that was ~10% of a step.
        """
        device = self.kv_spec.device
        capacity = cache.capacity
        heads = torch.arange(self.num_kv_heads, device=device)
        halves = torch.arange(2, device=device) * (cache.allocated_slots * self.num_kv_heads)
        slots_t = torch.tensor(slots, device=device)
        rows = slots_t[:, None, None] * self.num_kv_heads + heads[None, None, :]
        base = (rows + halves[None, :, None]) * capacity
        return (base + positions[:, None, None]).reshape(-1)

    def _decode_plan(self, batch: StepBatch, cache: KVCache) -> list[DecodeGroup]:
        """How decode attention reads the cache: usually one view, split off long outliers.

        Decode slots are usually exactly 0..n-1, read as the view K[:n, :, :longest]; when a
        prefilling sequence sits among them, the view spans it too and its row is computed
        and discarded (cheaper than a gather). A view is as long as its longest row, so one
        2,000-token sequence would make 31 short ones attend over 2,000 masked positions:
        rows longer than twice the median (and over LONG_ROW) are gathered and attended apart.
        """
        if not batch.decode_slots:
            return []
        slots = batch.decode_slots
        lengths = [max(cache.lengths[slot], 1) for slot in slots]
        limit = max(LONG_ROW, 2 * sorted(lengths)[len(lengths) // 2])
        long_rows = [row for row, length in enumerate(lengths) if length > limit]
        if not long_rows:
            return [self._view_group(None, slots, cache)]
        long_set = set(long_rows)
        short_rows = [row for row in range(len(slots)) if row not in long_set]
        groups = [self._gather_group(long_rows, [slots[r] for r in long_rows], cache)]
        if short_rows:
            groups.append(self._view_group(short_rows, [slots[r] for r in short_rows], cache))
        return groups

    def _view_group(self, rows: list[int] | None, slots: list[int], cache: KVCache) -> DecodeGroup:
        """Rows read through the view K[:span, :, :longest] (slots ascending)."""
        device = self.kv_spec.device
        span = slots[-1] + 1
        lengths = [max(length, 1) for length in cache.lengths[:span]]
        longest = key_extent(max(lengths[slot] for slot in slots), cache.capacity)
        lengths_t = torch.tensor(lengths, device=device)
        visible = torch.arange(longest, device=device)[None, :] < lengths_t[:, None]
        scatter = None if span == len(slots) else torch.tensor(slots, device=device)
        return DecodeGroup(
            rows=None if rows is None else torch.tensor(rows, device=device),
            span=span,
            longest=longest,
            visible=self._additive(visible[:, None, None, :]),
            scatter=scatter,
            gather=None,
        )

    def _gather_group(self, rows: list[int], slots: list[int], cache: KVCache) -> DecodeGroup:
        """Rows whose K/V prefixes are gathered out of the cache (the long outliers)."""
        device = self.kv_spec.device
        lengths = torch.tensor([cache.lengths[slot] for slot in slots], device=device)
        longest = key_extent(int(lengths.max()), cache.capacity)
        visible = torch.arange(longest, device=device)[None, :] < lengths[:, None]
        return DecodeGroup(
            rows=torch.tensor(rows, device=device),
            span=len(slots),
            longest=longest,
            visible=self._additive(visible[:, None, None, :]),
            scatter=None,
            gather=torch.tensor(slots, device=device),
        )

    def chunk_key_seconds(self) -> float:
        """Seconds a prompt chunk's attention costs per key it attends (chunk token x its
        end position), all layers together, timed on a scratch cache of random K/V.

        The prefill pacer bounds a step's chunks by their keys at a per-key cost it fits from
        step times (pacing.py, `keys`); a long prompt's late chunks are where that matters,
        and where a fit from noisy steps once read 0, which lifted the bound altogether. This
        is a floor for the fit: what the keys cost at the least, measured once at start."""
        start = max(0, min(KEY_PROBE, self.context_length - MIN_CHUNK))
        end = start + MIN_CHUNK
        spec = self.kv_spec
        cache = KVCache(spec, 1, end, initial_capacity=end, fresh_pages=False)
        slot = cache.allocate()
        cache.extend(slot, end)
        for layer in range(spec.num_layers):
            cache.layer(layer).normal_()
        q = torch.randn(MIN_CHUNK, self.num_heads * self.head_dim, dtype=spec.dtype)
        q = q.to(spec.device)
        kernel = self.chunk_kernel

        def every_layer(chunk: PrefillChunk, visible: torch.Tensor | None) -> None:
            for layer in range(spec.num_layers):
                keys, values = cache.layer(layer)
                self._chunk_attention(q, keys, values, chunk, visible, kernel)

        def fastest(position: int) -> float:
            chunk = PrefillChunk(slot, position, [0] * MIN_CHUNK, needs_logits=False)
            visible = None if kernel else self._causal_visible(position, MIN_CHUNK, cache.capacity)
            return fastest_seconds(partial(every_layer, chunk, visible), PROBE_RUNS)

        extra = fastest(start) - fastest(0)
        return max(extra, 0.0) / (MIN_CHUNK * max(start, 1))

    def _causal_visible(self, start: int, size: int, capacity: int) -> torch.Tensor:
        """Which keys each query of a chunk sees: those up to its own position, out of
        `key_extent` keys (the chunk's end rounded up)."""
        device = self.kv_spec.device
        keys = torch.arange(key_extent(start + size, capacity), device=device)
        queries = torch.arange(start, start + size, device=device)
        return self._additive(keys[None, :] <= queries[:, None])

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """A boolean mask as SDPA's additive one (0 where visible, -inf elsewhere) in the
        model's dtype: made once a step, where a boolean mask is converted in every layer's
        call (two `where`s, ~30 µs a layer at 32 rows)."""
        mask = torch.zeros(visible.shape, dtype=self.kv_spec.dtype, device=visible.device)
        return mask.masked_fill_(~visible, float("-inf"))

    def _decode_attention(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        plan: list[DecodeGroup],
        kernel: Kernel,
    ) -> torch.Tensor:
        """Grouped attention of one query per decode sequence over its cached keys."""
        if len(plan) == 1 and plan[0].rows is None:
            return self._attend_group(q, keys, values, plan[0], kernel)
        out = q.new_empty(q.shape[0], self.num_heads * self.head_dim)
        for group in plan:
            out[group.rows] = self._attend_group(q[group.rows], keys, values, group, kernel)
        return out

    def _attend_group(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        group: DecodeGroup,
        kernel: Kernel,
    ) -> torch.Tensor:
        n = q.shape[0]
        q = q.view(n, self.num_kv_heads, self.groups, self.head_dim)
        if group.scatter is not None:
            full = q.new_zeros(group.span, self.num_kv_heads, self.groups, self.head_dim)
            full[group.scatter] = q
            q = full
        if group.gather is not None:
            k = keys[:, :, : group.longest].index_select(0, group.gather)
            v = values[:, :, : group.longest].index_select(0, group.gather)
        else:
            k = keys[: group.span, :, : group.longest]
            v = values[: group.span, :, : group.longest]
        # The g query heads sharing a KV head are g queries of one head: no mask between
        # them, one read of K and V (decode_attention.py).
        out = kernel(q, k, v, group.visible, self.scaling)
        if group.scatter is not None:
            out = out[group.scatter]
        return out.reshape(n, self.num_heads * self.head_dim)

    def _chunk_attention(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        chunk: PrefillChunk,
        visible: torch.Tensor | None,
        kernel: ChunkKernel | None,
    ) -> torch.Tensor:
        """Causal grouped attention of a prefill chunk over its slot's prefix and itself: on
        the C++ kernel where it is built (no mask: it attends by position), else SDPA with
        `visible`."""
        size = q.shape[0]
        if kernel is not None:
            grouped = q.view(size, self.num_kv_heads, self.groups, self.head_dim)
            out = kernel(grouped, keys[chunk.slot], values[chunk.slot], chunk.start, self.scaling)
            return out.view(size, self.num_heads * self.head_dim)
        extent = visible.shape[-1]
        q = q.view(1, size, self.num_heads, self.head_dim).transpose(1, 2)
        k = keys[chunk.slot, :, :extent].unsqueeze(0)
        v = values[chunk.slot, :, :extent].unsqueeze(0)
        out = scaled_dot_product_attention(
            q, k, v, attn_mask=visible, scale=self.scaling, enable_gqa=True
        )
        return out[0].transpose(0, 1).reshape(size, self.num_heads * self.head_dim)


def key_extent(end: int, capacity: int) -> int:
    """Keys an attention call reads for rows that end at `end`: `end` rounded up to
    KEY_BLOCK, the rest masked, within the cache.

    SDPA's fused kernel sums a query's keys in an order that follows how many keys it is
    given. Given exactly the keys a row needs, a decode row came out differently next to a
    longer companion (the view is as long as its longest row) and a prompt's rows
    differently when it was cut into other chunks (bfloat16: 103 of 200 random decode rows,
    36 of 40 prompt cuts). On a grid of key counts, always masked, every case was
    bit-identical: a request's tokens stay its own whatever its companions.
    """
    return min(capacity, -(-end // KEY_BLOCK) * KEY_BLOCK)
