"""The cost of picking one sampled token per row, with the chat's settings, against HF.

    .venv/bin/python -m bench.sampling            # docs/benchmarks.md

Real logits: SmolLM2's last-position logits for the bench's chat prompts (float32, as the
engine samples). Peers, on the same rows: HF's logits warpers (temperature, top-p) over the
whole batch plus `torch.multinomial` — what `generate(do_sample=True)` does per step, and the
arithmetic Tandem's sampler used before it took the nucleus from a top-k — and Tandem's
samplers, over the whole step as the engine calls them (`sample_rows`) and one row at a time.
Prints ms per row and the ratios.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from bench.stats import median_seconds
from bench.workload import chat_prompts
from inference.engine.sampling import RequestSampler, SamplingParams, sample_rows
from inference.provisioning import loading


def last_logits(model, tokenizer, rows: int) -> torch.Tensor:
    """[rows, vocab] float32 logits of the last prompt position, one forward per prompt."""
    out = []
    with torch.inference_mode():
        for ids in chat_prompts(tokenizer, rows):
            logits = model(torch.tensor([ids])).logits[0, -1]
            out.append(logits.float())
    return torch.stack(out)


def per_row_ms(fn, rows: int, repeats: int) -> float:
    """Median wall time of `fn()` over `repeats` calls, divided by the rows it samples."""
    return median_seconds(fn, repeats) * 1000 / rows


def chat_params() -> SamplingParams:
    """The chat's own sampling (chat/sampling.py, from the settings), seeded for the bench."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from chat.sampling import chat_sampling

    return replace(chat_sampling(), seed=0)


def hf_step(
    params: SamplingParams, logits: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """One step of HF sampling over the batch: warpers, softmax, multinomial."""
    ids = torch.zeros((logits.shape[0], 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(params.temperature)(ids, logits)
    scores = TopPLogitsWarper(params.top_p)(ids, scores)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)


def compare(
    params: SamplingParams, batch: torch.Tensor, repeats: int
) -> tuple[float, float, float]:
    """ms per row for HF's batched sampling, Tandem's step over all rows, and row by row."""
    rows, vocab = batch.shape
    generator = torch.Generator().manual_seed(0)
    samplers = [RequestSampler(params, [0], vocab, torch.device("cpu")) for _ in range(rows)]
    hf = per_row_ms(lambda: hf_step(params, batch.clone(), generator), rows, repeats)
    step = per_row_ms(lambda: sample_rows(batch, samplers), rows, repeats)
    one_by_one = per_row_ms(
        lambda: [s.sample(row) for s, row in zip(samplers, batch, strict=True)], rows, repeats
    )
    return hf, step, one_by_one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    params = chat_params()
    loaded = loading.load(args.model, args.dtype)
    logits = last_logits(loaded.model, loaded.tokenizer, max(args.rows))
    vocab = logits.shape[-1]
    print(
        f"vocabulary {vocab}, temperature {params.temperature}, top_p {params.top_p}, "
        f"repetition_penalty {params.repetition_penalty}"
    )
    print(
        "| rows | HF warpers + multinomial, ms/row | Tandem, the step's rows together, ms/row "
        "| Tandem, row by row, ms/row | HF / together | row by row / together |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for rows in args.rows:
        hf, step, one = compare(params, logits[:rows].clone(), args.repeats)
        print(
            f"| {rows} | {hf:.2f} | {step:.2f} | {one:.2f} | {hf / step:.1f}× "
            f"| {one / step:.1f}× |",
            flush=True,
        )


if __name__ == "__main__":
    main()
