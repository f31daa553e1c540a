"""Head-of-line blocking in Tandem's engine: does a busy batch delay a newcomer?

1. TTFT of a request arriving while 31 others decode, against its TTFT on an idle engine.
2. A 2,000-token prompt arriving mid-stream: the 31 decoders' inter-token latency during its
   (chunked) prefill, against their latency just before it arrived.

`bench.engine` runs it after the peers; alone (same engine settings, compiled step on):

    .venv/bin/python -m bench.head_of_line            # add --steps for every step's log
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from bench.peers.tandem import TandemPeer
from bench.stats import Trace
from bench.workload import burst, chat_prompts
from inference.engine import EngineConfig, EngineObserver
from inference.engine.compile_cache import CompileCache
from inference.engine.weights.choice import build_runner
from inference.provisioning import loading, model_source
from inference.provisioning.startup import freeze_heap

BACKGROUND = 31
ENDLESS = 1_000_000
# The decoders' gaps just before the long prompt, each after the probes' steps are over (a
# probe's own step between two of their tokens once made those gaps twice a decode step).
BEFORE_GAPS = 5
# A loaded probe arrives at a random moment within this span after a decoder's token, so it
# meets the step in flight at a random point of it, as a user's request would: submitted
# right after the previous probe's last token, it landed at the same phase each time.
PHASE_SPAN = 0.1
LONG_TEXT = (
    "Continuous batching lets an inference server admit new requests between decoding "
    "steps instead of waiting for a whole batch to finish. "
)


@dataclass
class HeadOfLine:
    """The figures, in milliseconds."""

    idle_ttft_ms: float
    loaded_ttft_ms: float
    loaded_over_idle: float
    long_prompt_tokens: int
    long_prompt_ttft_ms: float
    itl_before_p50_ms: float
    itl_during_p50_ms: float
    itl_during_p99_ms: float
    itl_during_max_ms: float


def long_prompt(tokenizer, size: int) -> list[int]:
    """A prompt of exactly `size` tokens (a repeated paragraph)."""
    ids = tokenizer.encode(LONG_TEXT, add_special_tokens=False)
    return (ids * (size // len(ids) + 1))[:size]


def _probe(peer: TandemPeer, prompt: list[int], new_tokens: int) -> Trace:
    """One request, waited for; its trace."""
    trace, done = Trace(arrival=0.0), threading.Semaphore(0)
    peer.submit([prompt], new_tokens, [trace], done)
    done.acquire()
    return trace


def _gaps_until(trace: Trace, moment: float) -> list[float]:
    """The trace's inter-token gaps that ended by `moment`."""
    return [b - a for a, b in zip(trace.stamps, trace.stamps[1:], strict=False) if b <= moment]


def _wait_for(condition, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("background streams did not start decoding")
        time.sleep(0.01)


def _settle(traces: list[Trace], tokens: int) -> None:
    """Wait until every stream has made `tokens` more tokens: steps of decoders alone, with
    no probe's step between them."""
    counts = [len(t.stamps) for t in traces]
    _wait_for(lambda: all(len(t.stamps) >= n + tokens for t, n in zip(traces, counts, strict=True)))


def run(
    peer: TandemPeer, tokenizer, prompts: list[list[int]], long_tokens: int, repeats: int = 5
) -> HeadOfLine:
    """Idle probes, then 31 endless streams with a short probe and a long prompt among them."""
    probe = prompts[0]
    idle = [_probe(peer, probe, 2).ttft for _ in range(repeats)]

    done = threading.Semaphore(0)
    traces = [Trace(arrival=0.0) for _ in range(BACKGROUND)]
    background = [prompts[i % len(prompts)] for i in range(BACKGROUND)]
    ids = peer.submit(background, ENDLESS, traces, done)
    try:
        loaded = []
        phases = random.Random(0)
        for _ in range(repeats):
            _settle(traces, 3)
            time.sleep(phases.uniform(0.0, PHASE_SPAN))
            loaded.append(_probe(peer, probe, 2).ttft)

        _settle(traces, BEFORE_GAPS + 1)
        arrived = time.perf_counter()
        long = _probe(peer, long_prompt(tokenizer, long_tokens), 1)
        first = long.stamps[0]
        before = [g for t in traces for g in _gaps_until(t, arrived)[-BEFORE_GAPS:]]
        during = [
            b - a
            for t in traces
            for a, b in zip(t.stamps, t.stamps[1:], strict=False)
            if arrived < b <= first
        ]
    finally:
        for request_id in ids:
            peer.engine.cancel(request_id)
        for _ in ids:
            done.acquire()
    idle_ms, loaded_ms = 1000 * float(np.median(idle)), 1000 * float(np.median(loaded))
    return HeadOfLine(
        idle_ttft_ms=idle_ms,
        loaded_ttft_ms=loaded_ms,
        loaded_over_idle=loaded_ms / idle_ms,
        long_prompt_tokens=long_tokens,
        long_prompt_ttft_ms=1000 * long.ttft,
        itl_before_p50_ms=1000 * float(np.median(before)),
        itl_during_p50_ms=1000 * float(np.median(during)) if during else float("nan"),
        itl_during_p99_ms=1000 * float(np.percentile(during, 99)) if during else float("nan"),
        itl_during_max_ms=1000 * max(during, default=float("nan")),
    )


class StepLog(EngineObserver):
    """Every step's shape and time, with the longest cached sequence (for --steps)."""

    def __init__(self, engine_cache) -> None:
        self.cache = engine_cache
        self.steps: list[tuple[float, int, int, int, float]] = []

    def on_step(
        self, batch_size: int, num_tokens: int, prefill_tokens: int, seconds: float
    ) -> None:
        longest = max(self.cache.lengths, default=0)
        self.steps.append((time.perf_counter(), num_tokens, prefill_tokens, longest, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\\n")[0])
    parser.add_argument(
        "--weights", default="auto", help="auto | bf16 | q4 | int8 | q8 | q4_1 | fp16"
    )
    parser.add_argument("--no-compile", action="store_true", help="the eager step only")
    parser.add_argument("--long-prompt", type=int, default=2000)
    parser.add_argument("--steps", action="store_true", help="print every step of the run")
    parser.add_argument(
        "--prefill-multiple",
        type=float,
        default=EngineConfig.prefill_multiple,
        help="the pacer's bound on a step with prefill, in reference decode steps",
    )
    args = parser.parse_args()
    loaded = loading.load(None, "auto")
    cache_dir = model_source.default_cache_dir() / "compiled"  # the web process's default
    runner = build_runner(loaded.model, args.weights, loaded.gguf, cache=CompileCache(cache_dir))
    if not args.no_compile:
        started = time.perf_counter()
        runner.compile_decode(cache_dir=cache_dir).join()
        print(f"compiled decode: {runner.compile_state} in {time.perf_counter() - started:.0f} s")
    config = EngineConfig(
        max_running=32, max_step_tokens=512, prefill_multiple=args.prefill_multiple
    )
    peer = TandemPeer(loaded.model, loaded.tokenizer, config, runner)
    freeze_heap()  # as the web process does once its engine runs (startup.py)
    log = StepLog(peer.engine.cache)
    peer.engine.observer = log
    prompts = chat_prompts(loaded.tokenizer, 16)
    peer.run(prompts[:2], burst(2), 2)
    started = time.perf_counter()
    hol = run(peer, loaded.tokenizer, prompts, args.long_prompt)
    peer.shutdown()
    if args.steps:
        # gap: from the previous step's end to this one's start (scheduling, page-ahead,
        # the events' delivery): an inter-token latency is a step plus its gap.
        print(f"{'t s':>7} {'tokens':>6} {'prefill':>7} {'longest':>7} {'ms':>7} {'gap ms':>7}")
        previous = None
        for stamp, tokens, prefill, longest, seconds in log.steps:
            if stamp >= started and previous is not None:
                gap = 1000 * (stamp - seconds - previous)
                print(
                    f"{stamp - started:7.3f} {tokens:6d} {prefill:7d} {longest:7d} "
                    f"{1000 * seconds:7.1f} {gap:7.1f}"
                )
            previous = stamp
    print(f"weights {runner.weights}  compile {runner.compile_state}")
    pacer = peer.engine.pacer
    fitted = "none" if pacer.key_seconds is None else f"{1e9 * pacer.key_seconds:.1f}"
    print(f"prompt key cost, ns: fitted {fitted}, measured floor {1e9 * pacer.key_floor:.1f}")
    if args.steps:
        for name, table in (("with decoders", pacer.seconds), ("prefill alone", pacer.alone)):
            times = ", ".join(f"{rows}: {1000 * s:.1f}" for rows, s in sorted(table.items()))
            print(f"step ms by row bucket, {name}: {times}")
    for key, value in asdict(hol).items():
        print(f"{key:<22} {value:10.1f}")
    print(f"stall (during p99 / before p50) {hol.itl_during_p99_ms / hol.itl_before_p50_ms:.2f}")


if __name__ == "__main__":
    main()
