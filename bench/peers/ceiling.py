"""The ceiling: the bare model forward on the decode batch shape, in a loop.

B sequences x 1 token, no KV history, logits for that one position: no scheduling, no
sampling, no detokenisation, no streaming. B / (seconds per forward) is the most tokens/s
any decoder built on this forward could reach at batch B.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel


def forward_seconds(model: PreTrainedModel, batch: int, repeats: int) -> float:
    """Median seconds of one forward of [batch, 1] tokens (after two warm-up calls)."""
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=model.device)
    times = []
    with torch.inference_mode():
        for i in range(repeats + 2):
            started = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            if i >= 2:
                times.append(time.perf_counter() - started)
    times.sort()
    return times[len(times) // 2]


def tokens_per_s(model: PreTrainedModel, batch: int, repeats: int = 10) -> float:
    """The ceiling in generated tokens/s at batch `batch`."""
    return batch / forward_seconds(model, batch, repeats)
