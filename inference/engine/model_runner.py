"""The model runner: one forward pass over a step's tokens, reading and writing the KV cache.

The runner reuses the HF model's own modules (norms, projections, MLP, rotary embedding,
lm_head), so weights, dtype and device are whatever the loaded model has; it replaces only
the attention and cache plumbing. All tokens of a step (decode tokens and prefill chunks)
go through the linear layers as one [tokens, hidden] matrix; attention is split: one
batched grouped matmul over the compacted cache view for decode tokens, and one causal
attention per prefill chunk. Logits are computed only for rows that pick a token.
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.errors import UnsupportedModel
from inference.engine.kv_cache import KVCache, KVSpec

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
DYNAMIC_ROPE_TYPES = ("dynamic", "longrope")


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

    def __init__(self, model: PreTrainedModel) -> None:
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
        """Feed the step's tokens through every layer; logits only for sampling rows."""
        device = self.kv_spec.device
        token_ids = list(batch.decode_token_ids)
        slots = list(batch.decode_slots)
        positions = list(batch.decode_positions)
        for chunk in batch.chunks:
            token_ids.extend(chunk.token_ids)
            slots.extend([chunk.slot] * len(chunk.token_ids))
            positions.extend(range(chunk.start, chunk.start + len(chunk.token_ids)))
        ids_t = torch.tensor(token_ids, device=device)
        slots_t = torch.tensor(slots, device=device)
        positions_t = torch.tensor(positions, device=device)

        inner = self.model.model
        hidden = inner.embed_tokens(ids_t)
        cos, sin = inner.rotary_emb(hidden, positions_t[None])
        cos, sin = cos[0], sin[0]
        decode = self._decode_plan(batch, cache)
        chunk_masks = [self._causal_mask(c.start, len(c.token_ids)) for c in batch.chunks]

        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attention.q_proj(x).view(-1, self.num_heads, self.head_dim)
            k = attention.k_proj(x).view(-1, self.num_kv_heads, self.head_dim)
            v = attention.v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
            keys, values = cache.keys(index), cache.values(index)
            keys[slots_t, :, positions_t] = k
            values[slots_t, :, positions_t] = v
            parts = []
            if decode is not None:
                parts.append(
                    self._decode_attention(q[: len(batch.decode_slots)], keys, values, *decode)
                )
            offset = len(batch.decode_slots)
            for chunk, mask in zip(batch.chunks, chunk_masks, strict=True):
                size = len(chunk.token_ids)
                parts.append(
                    self._chunk_attention(q[offset : offset + size], keys, values, chunk, mask)
                )
                offset += size
            attended = parts[0] if len(parts) == 1 else torch.cat(parts)
            hidden = hidden + attention.o_proj(attended)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))

        rows = list(range(len(batch.decode_slots)))
        offset = len(batch.decode_slots)
        for chunk in batch.chunks:
            offset += len(chunk.token_ids)
            if chunk.needs_logits:
                rows.append(offset - 1)
        picked = hidden[rows] if len(rows) != hidden.shape[0] else hidden
        return self.model.lm_head(inner.norm(picked)).float()

    def _decode_plan(
        self, batch: StepBatch, cache: KVCache
    ) -> tuple[int, int, torch.Tensor, torch.Tensor | None] | None:
        """The decode attention's view size, length mask and slot scatter (if not 0..n-1).

        Decode slots are usually exactly 0..n-1; when a prefilling sequence sits among them,
        the view spans it too and its row is computed and discarded (cheaper than a gather).
        """
        if not batch.decode_slots:
            return None
        device = self.kv_spec.device
        span = batch.decode_slots[-1] + 1
        lengths = [max(length, 1) for length in cache.lengths[:span]]
        longest = max(lengths)
        lengths_t = torch.tensor(lengths, device=device)
        mask = torch.arange(longest, device=device)[None, :] >= lengths_t[:, None]
        scatter = None
        if span != len(batch.decode_slots):
            scatter = torch.tensor(batch.decode_slots, device=device)
        return span, longest, mask[:, None, None, :], scatter

    def _causal_mask(self, start: int, size: int) -> torch.Tensor:
        """True where a chunk query may not see a key: keys after the query's position."""
        device = self.kv_spec.device
        keys = torch.arange(start + size, device=device)
        queries = torch.arange(start, start + size, device=device)
        return keys[None, :] > queries[:, None]

    def _decode_attention(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        span: int,
        longest: int,
        mask: torch.Tensor,
        scatter: torch.Tensor | None,
    ) -> torch.Tensor:
        """Grouped attention of one query per decode sequence over its cached keys."""
        n = q.shape[0]
        q = q.view(n, self.num_kv_heads, self.groups, self.head_dim)
        if scatter is not None:
            full = q.new_zeros(span, self.num_kv_heads, self.groups, self.head_dim)
            full[scatter] = q
            q = full
        k = keys[:span, :, :longest]
        v = values[:span, :, :longest]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        scores = scores.masked_fill(mask, float("-inf"))
        probs = scores.softmax(-1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs, v)
        if scatter is not None:
            out = out[scatter]
        return out.reshape(n, self.num_heads * self.head_dim)

    def _chunk_attention(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        chunk: PrefillChunk,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Causal grouped attention of a prefill chunk over its slot's prefix and itself."""
        size = q.shape[0]
        end = chunk.start + size
        q = q.view(size, self.num_kv_heads, self.groups, self.head_dim).permute(1, 2, 0, 3)
        k = keys[chunk.slot, :, :end].unsqueeze(1)
        v = values[chunk.slot, :, :end].unsqueeze(1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        scores = scores.masked_fill(mask, float("-inf"))
        probs = scores.softmax(-1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs, v)
        return out.permute(2, 0, 1, 3).reshape(size, self.num_heads * self.head_dim)
