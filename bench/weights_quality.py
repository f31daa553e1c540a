"""What TANDEM_WEIGHTS=q4, int8, q8 and q4_1 cost in quality and gain in speed against bf16
(SmolLM2), or (--fp16) what fp16, q8 and q4_1 cost and gain against the float32 weights of a
float32 model.

    .venv/bin/python -m bench.weights_quality            # figures in docs/engine.md
    .venv/bin/python -m bench.weights_quality --fp16

Quality: greedy agreement with the bf16 model over the 16 bench prompts × 64 tokens (the others
one request at a time, so every decode step runs the weight-only kernel; and with all 16 at
once, which runs the other packing of the same weights), and the perplexity of each on
tests/data/perplexity.txt, every position scored through the runner (on the weight-only
kernel for every row).
Speed: decode tok/s of one stream and of 32 streams (EOS ignored), on the engine.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from bench.workload import chat_prompts
from inference.engine import Engine, EngineConfig, SamplingParams
from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.kv_cache import KVCache
from inference.engine.model_runner import ModelRunner
from inference.engine.weights.choice import build_runner
from inference.provisioning import loading, model_source

EVERY_ROW = 1 << 20  # a crossover no step reaches: every row on the weight-only kernel
TEXT = Path(__file__).resolve().parent.parent / "tests" / "data" / "perplexity.txt"


def perplexity(runner: ModelRunner, ids: list[int]) -> float:
    """exp(mean NLL) of ids[1:] given their prefixes, in one forward.

    Every position is its own one-token prefill chunk of the same slot, so the step returns
    a logits row per position (the runner writes a step's K/V before attending).
    """
    cache = KVCache(runner.kv_spec, 1, len(ids))
    slot = cache.allocate()
    cache.extend(slot, len(ids))
    chunks = [PrefillChunk(slot, i, [token], needs_logits=True) for i, token in enumerate(ids)]
    with torch.inference_mode():
        logits = runner.forward(StepBatch(chunks=chunks[:-1]), cache)
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))
    return math.exp(nll.item())


def greedy(
    engine: Engine, prompts: list[list[int]], tokens: int, together: bool
) -> list[list[int]]:
    """Greedy continuations, EOS ignored: all prompts in one batch, or one at a time."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    if together:
        results = engine.generate_batch([(None, p, params) for p in prompts], timeout=600)
        return [r.token_ids for r in results]
    return [engine.generate_batch([(None, p, params)], timeout=600)[0].token_ids for p in prompts]


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[int, float]:
    """Identical continuations, and the mean share of tokens before the first difference."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    prefixes = []
    for x, y in zip(a, b, strict=True):
        prefix = next((i for i, (s, t) in enumerate(zip(x, y, strict=True)) if s != t), len(x))
        prefixes.append(prefix / len(x))
    return same, sum(prefixes) / len(prefixes)


def tok_per_s(engine: Engine, prompts: list[list[int]], tokens: int) -> float:
    """Generated tokens per second for a burst of prompts (prefill included)."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    started = time.perf_counter()
    engine.generate_batch([(None, p, params) for p in prompts], timeout=600)
    return len(prompts) * tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--speed-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--speed-only", action="store_true", help="skip the quality figures")
    parser.add_argument("--fp16", action="store_true", help="fp16 against a float32 model")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = loading.load(None, "float32" if args.fp16 else "bfloat16")
    model, tokenizer = loaded.model, loaded.tokenizer
    gguf = model_source.packaged_gguf()
    if args.fp16:
        base, compared = "float32", ("fp16", "q8", "q4_1")
    else:
        base, compared = "bf16", ("q4", "int8", "q8", "q4_1")
    runners = {base: build_runner(model, "bf16", gguf)}
    runners.update({name: build_runner(model, name, gguf) for name in compared})
    scored = {  # fp16 has one kernel at every row count
        name: runner if name in (base, "fp16") else build_runner(model, name, gguf, EVERY_ROW)
        for name, runner in runners.items()
    }
    text_ids = tokenizer(TEXT.read_text())["input_ids"]
    prompts = chat_prompts(tokenizer, 16)
    config = EngineConfig(max_running=32, max_step_tokens=512)
    outputs: dict[str, list[list[int]]] = {}
    for name, runner in runners.items():
        engine = Engine(model, tokenizer, config, runner=runner).start()
        try:
            if not args.speed_only:
                ppl = perplexity(scored[name], text_ids)
                print(f"{name}: perplexity {ppl:.3f} ({len(text_ids)} tokens)", flush=True)
                outputs[name] = greedy(engine, prompts, args.tokens, together=name == base)
            if name != base and not args.speed_only:
                outputs[f"{name} batched"] = greedy(engine, prompts, args.tokens, together=True)
            greedy(engine, prompts[:2], 4, together=True)
            one = tok_per_s(engine, prompts[:1], args.speed_tokens)
            many = tok_per_s(engine, chat_prompts(tokenizer, 32), args.speed_tokens)
            print(f"{name}: 1 stream {one:.1f} tok/s, 32 streams {many:.1f} tok/s", flush=True)
        finally:
            engine.shutdown()
    if args.speed_only:
        return
    for name in compared:
        for run in (name, f"{name} batched"):
            same, share = agreement(outputs[base], outputs[run])
            print(
                f"{run} vs {base}: {same}/16 identical, {share:.1%} of tokens before a difference"
            )
        same, share = agreement(outputs[name], outputs[f"{name} batched"])
        print(f"{name} alone vs batched: {same}/16 identical, {share:.1%} before a difference")


if __name__ == "__main__":
    main()
