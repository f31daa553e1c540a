"""What the hop to a remote engine costs on one box: TTFT p50 overhead, 32-stream throughput ratio.

The same greedy streams (the bench's chat prompts, `ignore_eos`, N new tokens each), two ways,
one after the other so they never share the CPU:
- local: the model's engine in this process, each stream submitted as the chat submits it
  (`engine.submit` with a callback), each piece stamped as its event arrives;
- remote: an engine-role Tandem Daphne on this box (the same model, limits and weights), through
  the chat's own client of remote engines (`inference/provisioning/remote_engine.py`), each piece
  stamped as its event arrives.
One stream at a time gives the TTFT (p50 over the repeats); STREAMS at once, the throughput.

    .venv/bin/python -m bench.remote_engine --quick      # a minute or two, for development
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from bench.peers.tandem_http import Settings, TandemServer
from bench.stats import Figures, PeerRun, Trace, summarise
from bench.workload import chat_messages, chat_prompts

Submit = Callable[[object, object, Callable, str], None]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, no compiled step")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10, help="single streams for the TTFT")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()
    if args.quick:
        args.new_tokens, args.repeats = 16, 3
    return args


def stamped(submit: Submit, prompts: list, params, timeout: float = 600) -> PeerRun:
    """Submit every prompt at once; each trace's stamps are its pieces' arrivals."""
    traces: list[Trace] = []
    left = [len(prompts)]
    fed = [0]
    failures: list[str] = []
    lock, done = threading.Lock(), threading.Event()

    def callback(trace: Trace):
        def on_event(event) -> None:
            now = time.perf_counter()
            if event.text:
                trace.stamps.append(now)
            if not event.is_finished:
                return
            with lock:
                if event.usage is not None:
                    trace.tokens = event.usage.completion_tokens
                    fed[0] += event.usage.total_tokens
                if event.error:
                    failures.append(event.error)
                left[0] -= 1
                if not left[0]:
                    done.set()

        return on_event

    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        trace = Trace(arrival=time.perf_counter())
        traces.append(trace)
        submit(prompt, params, callback(trace), f"bench-remote-{index}-{time.monotonic_ns()}")
    if not done.wait(timeout):
        raise TimeoutError(f"{left[0]} streams unfinished after {timeout:.0f} s")
    if failures:
        raise RuntimeError(f"{len(failures)} streams failed: {failures[0]}")
    ended = max(trace.stamps[-1] for trace in traces)
    return PeerRun(traces=traces, tokens_fed=fed[0], started=started, ended=ended)


def measure(name: str, submit: Submit, prompts_of: Callable[[int], list], args) -> list[Figures]:
    """A warm-up stream, `repeats` single streams, then `streams` at once."""
    from inference.engine import SamplingParams

    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    stamped(submit, prompts_of(1), params)
    singles = [stamped(submit, prompts_of(1), params) for _ in range(args.repeats)]
    single = PeerRun(
        traces=[run.traces[0] for run in singles],
        tokens_fed=sum(run.tokens_fed for run in singles),
        started=singles[0].started,
        ended=singles[-1].ended,
    )
    burst = stamped(submit, prompts_of(args.streams), params)
    return [
        summarise(name, "one at a time", args.new_tokens, single),
        summarise(name, "burst", args.new_tokens, burst),
    ]


def main() -> None:
    args = parse()
    workdir = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    settings = Settings(
        max_running=args.streams,
        step_tokens=512,
        dtype=args.dtype,
        weights=args.weights,
        compile=not args.quick,
    )
    box = TandemServer(workdir, settings)
    box.env["TANDEM_ROLE"] = "engine"
    os.environ.update({**box.env, "TANDEM_ENGINE_API_KEY": box.env["TANDEM_API_KEYS"]})
    # A burst's first token waits for every prompt's prefill: on a busy CPU that is longer than
    # the chat's stall timeout, which is for a stream that stopped, not one that queues.
    os.environ.setdefault("TANDEM_ENGINE_STALL_TIMEOUT", "600")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from inference.provisioning.remote_engine import RemoteEngine
    from inference.provisioning.startup import start_engine

    loaded, engine = start_engine()
    while getattr(engine.runner, "compile_state", "off") == "warming":  # as the box waits
        time.sleep(1)
    try:
        local = measure(
            "local",
            lambda prompt, params, on_event, rid: engine.submit(
                prompt, params, on_event=on_event, request_id=rid
            ),
            lambda n: chat_prompts(loaded.tokenizer, n),
            args,
        )
    finally:
        engine.shutdown()
    with box:
        client = RemoteEngine([f"http://127.0.0.1:{box.port}"]).start()
        try:
            remote = measure("remote", client.submit, chat_messages, args)
        finally:
            client.close()

    rows = [*local, *remote]
    print(f"{'system':8} {'arrivals':14} {'tok/s':>8} {'TTFT p50':>9} {'ITL p50':>8} ms")
    for row in rows:
        print(
            f"{row.system:8} {row.arrivals:14} {row.tokens_per_s:8.1f} "
            f"{row.ttft_p50_ms:9.1f} {row.itl_p50_ms or 0:8.1f}"
        )
    overhead = remote[0].ttft_p50_ms - local[0].ttft_p50_ms
    ratio = remote[1].tokens_per_s / local[1].tokens_per_s
    print(f"TTFT p50 overhead (one stream): {overhead:+.1f} ms")
    print(f"throughput ratio, {args.streams} streams (remote / local): {ratio:.2f}")
    if args.json:
        figures = {"rows": [asdict(row) for row in rows], "ttft_overhead_ms": overhead}
        args.json.write_text(json.dumps({**figures, "throughput_ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
