"""HF `generate` on one static, left-padded batch: nobody joins or leaves until all finish.

A streamer records when each step's tokens come out (generate hands it the prompt first,
then one token per row per step), which gives TTFT and inter-token latency per row.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from bench.stats import PeerRun, Trace


class StepClock(BaseStreamer):
    """Stamps every step's tokens onto each row's trace; ignores the prompt."""

    def __init__(self, traces: list[Trace]) -> None:
        self.traces = traces
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        now = time.perf_counter()
        for trace in self.traces:
            trace.stamps.append(now)

    def end(self) -> None:
        """Nothing to flush."""


def run(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    new_tokens: int,
) -> PeerRun:
    """Exactly `new_tokens` greedy tokens per row (EOS ignored via min_new_tokens)."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device
    )
    started = time.perf_counter()
    traces = [Trace(arrival=started) for _ in prompts]
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
            streamer=StepClock(traces),
        )
    ended = time.perf_counter()
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return PeerRun(traces, ids.numel() + (new_tokens - 1) * len(prompts), started, ended, texts)
