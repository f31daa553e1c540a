"""Decode attention with a long outlier: the long row is attended apart, results unchanged."""

from __future__ import annotations

import torch

from inference.engine import SamplingParams
from inference.engine.model_runner import LONG_ROW
from tests.engine.helpers import WAIT, hf_greedy


def test_long_prompt_among_short_ones_matches_hf_greedy(tiny_model, tokenizer, make_engine) -> None:
    """A prompt past LONG_ROW sits between short ones (so the short view needs a scatter)."""
    generator = torch.Generator().manual_seed(7)
    sizes = [12, LONG_ROW + 80, 20, 9]
    batch = [torch.randint(100, 49152, (n,), generator=generator).tolist() for n in sizes]
    engine = make_engine(tiny_model, tokenizer, max_step_tokens=512, max_running=4)
    results = engine.generate_batch(
        [(None, p, SamplingParams(max_new_tokens=16)) for p in batch], timeout=WAIT
    )
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(tiny_model, prompt, 16)
