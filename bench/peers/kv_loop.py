"""The lecture's loop with a KV cache: the prompt is fed once, then one token per step.

Same greedy choice and per-token decode as `naive`, but the state is token ids plus HF's
DynamicCache, so step i feeds one token instead of prompt + i.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bench.stats import PeerRun, Trace


def fed_with_cache(prompt_len: int, new_tokens: int) -> int:
    """Tokens one stream feeds: the prompt once, then every generated token but the last."""
    return prompt_len + new_tokens - 1


def run(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], new_tokens: int
) -> PeerRun:
    """Generate `new_tokens` greedy tokens for every text with a growing KV cache."""
    started = time.perf_counter()
    traces = [Trace(arrival=started) for _ in texts]
    outputs = ["" for _ in texts]
    encoded = tokenizer(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    ).to(model.device)
    ids, mask = encoded.input_ids, encoded.attention_mask
    fed = 0
    cache = None
    with torch.inference_mode():
        for _ in range(new_tokens):
            fed += ids.numel()
            out = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
            cache = out.cache
            ids = out.logits[:, -1, :].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
            now = time.perf_counter()
            for i, token in enumerate(ids[:, 0].tolist()):
                outputs[i] += tokenizer.decode([token], skip_special_tokens=True)
                traces[i].stamps.append(now)
    return PeerRun(traces, fed, started, time.perf_counter(), outputs)
