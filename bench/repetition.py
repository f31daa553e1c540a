"""How much a chat reply repeats itself at a few temperature / repetition-penalty choices.

    nice -n 10 .venv/bin/python -m bench.repetition     # docs/chat.md, "Sampling defaults"

The real model behind the real engine, with the chat's own system prompt and template, on a
handful of everyday prompts. For each reply: the distinct-4-gram ratio over its tokens
(unique 4-grams / all 4-grams; 1.0 never repeats a four-token phrase, a reply stuck in a
loop falls towards 0) and whether it ran into the length limit (a loop never ends by itself).
Sampled settings run with several seeds. Prints one row per setting.
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass

import django

PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for learning to cook.",
    "Explain what a neural network is to a child.",
    "Write a short poem about the sea.",
    "Why is the sky blue?",
]


@dataclass(frozen=True)
class Choice:
    temperature: float
    repetition_penalty: float


def distinct_4(tokens: list[int]) -> float:
    """Unique 4-grams over all 4-grams of one reply (1.0 for a reply too short to have any)."""
    grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / len(grams) if grams else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.3, 0.7])
    parser.add_argument("--penalties", type=float, nargs="+", default=[1.0, 1.1, 1.2])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.conf import settings

    from inference.engine import Engine, EngineConfig, SamplingParams
    from inference.provisioning import loading
    from inference.provisioning.prompting import chat_prompt_ids

    loaded = loading.load(None, args.dtype)
    engine = Engine(loaded.model, loaded.tokenizer, EngineConfig(max_seq_len=2048)).start()
    prompts = [
        chat_prompt_ids(
            loaded.tokenizer,
            [
                {"role": "system", "content": settings.TANDEM_CHAT_SYSTEM_PROMPT},
                {"role": "user", "content": text},
            ],
        )
        for text in PROMPTS
    ]
    choices = [Choice(t, p) for t in args.temperatures for p in args.penalties]
    requests, keys = [], []
    for choice in choices:
        seeds = [0] if choice.temperature == 0 else list(range(args.seeds))
        for seed in seeds:
            params = SamplingParams(
                max_new_tokens=args.max_new_tokens,
                do_sample=choice.temperature > 0,
                temperature=choice.temperature or 1.0,
                top_p=args.top_p,
                repetition_penalty=choice.repetition_penalty,
                seed=seed,
            )
            for index, ids in enumerate(prompts):
                requests.append((None, ids, params))
                keys.append((choice, index))
    try:
        results = engine.generate_batch(requests)
    finally:
        engine.shutdown()

    print(f"{len(PROMPTS)} prompts, top_p {args.top_p}, max_new_tokens {args.max_new_tokens}")
    print("temperature  rep.penalty  distinct-4 mean  worst  hit length  mean tokens")
    for choice in choices:
        mine = [r for r, (c, _) in zip(results, keys, strict=True) if c == choice]
        ratios = [distinct_4(r.token_ids) for r in mine]
        at_limit = sum(r.finish_reason == "length" for r in mine)
        tokens = statistics.mean(len(r.token_ids) for r in mine)
        print(
            f"{choice.temperature:11.1f}  {choice.repetition_penalty:11.2f}  "
            f"{statistics.mean(ratios):15.3f}  {min(ratios):5.3f}  "
            f"{at_limit:4d} / {len(mine):<3d}  {tokens:11.0f}"
        )
    worst = min(zip(results, keys, strict=True), key=lambda rk: distinct_4(rk[0].token_ids))
    print("\nthe most repetitive reply", worst[1][0], f"prompt {worst[1][1]}:")
    print(worst[0].text[:600])


if __name__ == "__main__":
    main()
