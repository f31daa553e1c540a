"""transformers' own continuous batching: `generate_batch`, and its manager for arrivals.

A burst goes through `model.generate_batch` as documented. Staggered arrivals need requests
added while others run, which `generate_batch` cannot do, so they go through the manager it
is built on (`init_continuous_batching`, `add_request`), sized with the same workload hints.
Both record a time stamp per generated token (`record_timestamps`).
"""

from __future__ import annotations

import math
import time

from transformers import (
    ContinuousBatchingConfig,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.generation.continuous_batching.utils import WorkloadHints

from bench.stats import PeerRun, Trace
from bench.workload import sleep_until

NO_EOS = -1
PAGE = 256


def cb_config(
    prompts: list[list[int]], new_tokens: int, step_tokens: int
) -> ContinuousBatchingConfig:
    """Cache sized for exactly these requests (unsized, it takes 90% of free memory on a CPU).

    The step budget is the engine's `max_step_tokens`, so both schedulers batch alike.
    """
    pages = sum(math.ceil((len(p) + new_tokens) / PAGE) for p in prompts)
    return ContinuousBatchingConfig(
        page_size=PAGE,
        num_blocks=pages + 1,
        max_batch_tokens=step_tokens,
        max_requests_per_batch=len(prompts),
    )


def _config(tokenizer: PreTrainedTokenizerBase, new_tokens: int) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=NO_EOS,
        pad_token_id=tokenizer.pad_token_id,
    )


def _fed(prompts: list[list[int]], new_tokens: int) -> int:
    """Nominal feeding: each prompt once and one token per later step (padding not seen)."""
    return sum(len(p) + new_tokens - 1 for p in prompts)


def run_burst(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    new_tokens: int,
    step_tokens: int,
) -> PeerRun:
    """All prompts through one `generate_batch` call."""
    started = time.perf_counter()
    results = model.generate_batch(
        prompts,
        generation_config=_config(tokenizer, new_tokens),
        continuous_batching_config=cb_config(prompts, new_tokens, step_tokens),
        record_timestamps=True,
        max_new_tokens=new_tokens,
    )
    ended = time.perf_counter()
    ordered = list(results.values())
    traces = [Trace(arrival=started, stamps=list(r.timestamps or [])) for r in ordered]
    texts = [tokenizer.decode(r.generated_tokens, skip_special_tokens=True) for r in ordered]
    return PeerRun(traces, _fed(prompts, new_tokens), started, ended, texts)


def run_arrivals(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    arrivals: list[float],
    new_tokens: int,
    step_tokens: int,
) -> PeerRun:
    """Each prompt added to a running manager at its arrival offset."""
    hints = WorkloadHints(
        max_prompt_length=max(len(p) for p in prompts),
        max_generated_length=new_tokens,
        num_requests=len(prompts),
    )
    manager = model.init_continuous_batching(
        generation_config=_config(tokenizer, new_tokens),
        continuous_batching_config=cb_config(prompts, new_tokens, step_tokens),
        workload_hints=hints,
    )
    manager.warmup()
    manager.start()
    traces: dict[str, Trace] = {}
    try:
        started = time.perf_counter()
        for index, (prompt, offset) in enumerate(zip(prompts, arrivals, strict=True)):
            sleep_until(started + offset)
            request_id = f"r{index}"
            traces[request_id] = Trace(arrival=time.perf_counter())
            manager.add_request(
                prompt,
                request_id=request_id,
                max_new_tokens=new_tokens,
                record_timestamps=True,
                eos_token_id=NO_EOS,
            )
        finished = 0
        while finished < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                traces[result.request_id].stamps = list(result.timestamps or [])
                finished += 1
        ended = time.perf_counter()
    finally:
        manager.stop(block=True)
    return PeerRun(list(traces.values()), _fed(prompts, new_tokens), started, ended)
