"""Tandem's engine against HF `generate`, same prompts, same dtype, same process.

    .venv/bin/python -m bench.engine --streams 1 16 --new-tokens 64

Every request generates exactly --new-tokens tokens (EOS ignored by both), greedily, so the
work is identical. HF runs each concurrency level as one static batch (left-padded);
Tandem gets the same requests submitted at once. Prints a table with the ratio and writes
JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from inference import loading
from inference.engine import Engine, EngineConfig, EngineEvent, SamplingParams
from inference.prompting import chat_prompt_ids

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child.",
    "List three uses of a paperclip.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What is a prime number?",
    "Describe a cat in two sentences.",
    "How do airplanes fly?",
    "Tell me a fun fact about octopuses.",
    "What does a compiler do?",
    "Summarise the plot of Cinderella.",
    "How many legs does a spider have?",
    "Suggest a name for a bakery.",
    "What is the boiling point of water?",
    "Translate 'good morning' into Spanish.",
]
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Row:
    system: str
    streams: int
    new_tokens: int
    seconds: float
    tokens_per_s: float
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def prompts_for(tokenizer, n: int) -> list[list[int]]:
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    return [chat_prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def run_hf(model, tokenizer, prompts: list[list[int]], new_tokens: int) -> Row:
    """One static batch through `model.generate`, left-padded."""
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    seconds = time.perf_counter() - started
    generated = (out.shape[1] - width) * len(prompts)
    return Row("hf_generate_static", len(prompts), new_tokens, seconds, generated / seconds)


def run_engine(engine: Engine, prompts: list[list[int]], new_tokens: int) -> Row:
    """All requests submitted at once; TTFT and ITL from the events' arrival times."""
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    stamps: dict[str, list[float]] = {}
    done = threading.Semaphore(0)

    def recorder(key: str):
        def on_event(event: EngineEvent) -> None:
            if event.token_id is not None:
                stamps[key].append(time.perf_counter())
            if event.is_finished:
                done.release()

        return on_event

    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        stamps[str(i)] = []
        engine.submit(prompt, params, on_event=recorder(str(i)))
    for _ in prompts:
        done.acquire()
    seconds = time.perf_counter() - started
    ttfts = [s[0] - started for s in stamps.values()]
    itls = [b - a for s in stamps.values() for a, b in zip(s, s[1:], strict=False)]
    generated = sum(len(s) for s in stamps.values())
    return Row(
        "tandem_engine",
        len(prompts),
        new_tokens,
        seconds,
        generated / seconds,
        ttft_p50_ms=1000 * statistics.median(ttfts),
        ttft_p95_ms=1000 * percentile(ttfts, 0.95),
        itl_p50_ms=1000 * statistics.median(itls),
        itl_p99_ms=1000 * percentile(itls, 0.99),
    )


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()

    loaded = loading.load(args.model, args.dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    print(
        f"model {loaded.name}  dtype {loaded.dtype}  device {loaded.device}  "
        f"threads {torch.get_num_threads()}"
    )
    engine = Engine(model, tokenizer, EngineConfig(max_running=max(args.streams))).start()
    warm = prompts_for(tokenizer, 2)
    run_hf(model, tokenizer, warm, 4)
    run_engine(engine, warm, 4)

    rows: list[Row] = []
    for n in args.streams:
        prompts = prompts_for(tokenizer, n)
        rows.append(run_hf(model, tokenizer, prompts, args.new_tokens))
        rows.append(run_engine(engine, prompts, args.new_tokens))
    engine.shutdown()

    header = f"{'system':<20} {'streams':>7} {'tok/s':>8} {'wall s':>7} {'TTFT p50/p95 ms':>16} "
    print(header + f"{'ITL p50/p99 ms':>15}")
    for row in rows:
        print(
            f"{row.system:<20} {row.streams:>7} {row.tokens_per_s:>8.1f} {row.seconds:>7.2f} "
            f"{fmt(row.ttft_p50_ms) + '/' + fmt(row.ttft_p95_ms):>16} "
            f"{fmt(row.itl_p50_ms) + '/' + fmt(row.itl_p99_ms):>15}"
        )
    for n in args.streams:
        hf, ours = (r for r in rows if r.streams == n)
        print(f"ratio tandem/hf at {n} streams: {ours.tokens_per_s / hf.tokens_per_s:.2f}x")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"engine-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps({"model": loaded.describe(), "rows": [asdict(r) for r in rows]}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
