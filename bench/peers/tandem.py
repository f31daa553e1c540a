"""Tandem's engine: requests submitted at their arrival times, tokens stamped as they come.

An observer adds up the tokens each step feeds (decode tokens plus prompt chunks), which
is the engine's own count of model work.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

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
        self,
        prompts: list[list[int]],
        new_tokens: int,
        traces: list[Trace],
        done: threading.Semaphore,
    ) -> list[str]:
        """Submit requests arriving together, each stamping its tokens onto its trace;
        each releases `done` at its end."""

        def stamper(trace: Trace) -> Callable[[EngineEvent], None]:
            def on_event(event: EngineEvent) -> None:
                if event.token_id is not None:
                    trace.stamps.append(time.perf_counter())
                if event.is_finished:
                    done.release()

            return on_event

        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        now = time.perf_counter()
        for trace in traces:
            trace.arrival = now
        requests = [(None, p, params, stamper(t)) for p, t in zip(prompts, traces, strict=True)]
        return self.engine.submit_all(requests)

    def run(self, prompts: list[list[int]], arrivals: list[float], new_tokens: int) -> PeerRun:
        """Submit each prompt at started + its arrival offset and wait for all to finish.

        Prompts with the same offset arrive together (one `submit_all`), as a burst reaches
        HF's static batch: submitted one by one, the engine woke at the first and ran a
        step of two prompts before the other thirty were queued.
        The HF peers ran their kernels on this thread: its OpenMP workers are released
        first, as the engine's start did, or the engine's steps run at half speed.
        """
        release_thread_pool()
        done = threading.Semaphore(0)
        traces = [Trace(arrival=0.0) for _ in prompts]
        fed_before = self.feed.tokens
        started = time.perf_counter()
        order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
        for offset, group in itertools.groupby(order, key=lambda i: arrivals[i]):
            members = list(group)
            sleep_until(started + offset)
            self.submit(
                [prompts[i] for i in members], new_tokens, [traces[i] for i in members], done
            )
        for _ in prompts:
            done.acquire()
        ended = time.perf_counter()
        return PeerRun(traces, self.feed.tokens - fed_before, started, ended)

    def shutdown(self) -> None:
        """Stop the engine thread."""
        self.engine.shutdown()
