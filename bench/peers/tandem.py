"""Tandem's engine: requests submitted at their arrival times, tokens stamped as they come.

An observer adds up the tokens each step feeds (decode tokens plus prompt chunks), which
is the engine's own count of model work.
"""

from __future__ import annotations

import threading
import time

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from bench.stats import PeerRun, Trace
from bench.workload import sleep_until
from inference.engine import Engine, EngineConfig, EngineEvent, EngineObserver, SamplingParams
from inference.engine.model_runner import ModelRunner
from inference.engine.openmp import release_thread_pool


class FeedCounter(EngineObserver):
    """Counts the tokens the engine feeds the model."""

    def __init__(self) -> None:
        self.tokens = 0

    def on_step(
        self, batch_size: int, num_tokens: int, prefill_tokens: int, seconds: float
    ) -> None:
        self.tokens += num_tokens


class TandemPeer:
    """One engine kept across runs (it starts warm, like a server would)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: EngineConfig,
        runner: ModelRunner | None = None,
    ) -> None:
        self.feed = FeedCounter()
        self.engine = Engine(model, tokenizer, config, observer=self.feed, runner=runner).start()

    def submit(
        self, prompt: list[int], new_tokens: int, trace: Trace, done: threading.Semaphore
    ) -> str:
        """Submit one request whose tokens are stamped onto `trace`; release `done` at the end."""

        def on_event(event: EngineEvent) -> None:
            if event.token_id is not None:
                trace.stamps.append(time.perf_counter())
            if event.is_finished:
                done.release()

        trace.arrival = time.perf_counter()
        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        return self.engine.submit(prompt, params, on_event=on_event)

    def run(self, prompts: list[list[int]], arrivals: list[float], new_tokens: int) -> PeerRun:
        """Submit each prompt at started + its arrival offset and wait for all to finish.

        The HF peers ran their kernels on this thread: its OpenMP workers are released
        first, as the engine's start did, or the engine's steps run at half speed.
        """
        release_thread_pool()
        done = threading.Semaphore(0)
        traces = [Trace(arrival=0.0) for _ in prompts]
        fed_before = self.feed.tokens
        started = time.perf_counter()
        for prompt, offset, trace in zip(prompts, arrivals, traces, strict=True):
            sleep_until(started + offset)
            self.submit(prompt, new_tokens, trace, done)
        for _ in prompts:
            done.acquire()
        ended = time.perf_counter()
        return PeerRun(traces, self.feed.tokens - fed_before, started, ended)

    def shutdown(self) -> None:
        """Stop the engine thread."""
        self.engine.shutdown()
