"""The lecture's loop: string state, re-tokenised every step, no KV cache.

Each step tokenises every prompt string from scratch (left-padded batch), runs the whole
sequence through the model with `use_cache=False`, keeps the last position's logits, picks
the argmax, decodes that one id and appends the text to the prompt string. Nothing is kept
between steps, so step i feeds prompt + i tokens again.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bench.stats import PeerRun, Trace


def fed_without_cache(prompt_len: int, new_tokens: int) -> int:
    """Tokens one stream feeds: prompt, prompt+1, ... (if re-tokenising keeps the count)."""
    return new_tokens * prompt_len + new_tokens * (new_tokens - 1) // 2


def run(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], new_tokens: int
) -> PeerRun:
    """Generate `new_tokens` greedy tokens for every text; count every token fed."""
    prompts = list(texts)
    started = time.perf_counter()
    traces = [Trace(arrival=started) for _ in texts]
    outputs = ["" for _ in texts]
    fed = 0
    with torch.inference_mode():
        for _ in range(new_tokens):
            encoded = tokenizer(
                prompts,
                return_tensors="pt",
                padding=True,
                padding_side="left",
                add_special_tokens=False,
            ).to(model.device)
            fed += encoded.input_ids.numel()
            logits = model(
                input_ids=encoded.input_ids, attention_mask=encoded.attention_mask, use_cache=False
            ).logits[:, -1, :]
            picks = logits.argmax(-1).tolist()
            now = time.perf_counter()
            for i, token in enumerate(picks):
                piece = tokenizer.decode([token], skip_special_tokens=True)
                prompts[i] += piece
                outputs[i] += piece
                traces[i].stamps.append(now)
    return PeerRun(traces, fed, started, time.perf_counter(), outputs)
