"""The requests every peer serves: the same chat prompts, the same arrival times.

Arrivals are offsets in seconds from the start of a run: all at 0 (a burst, what a static
batch needs) or a Poisson process (exponential gaps, seeded, so every peer sees the same).
"""

from __future__ import annotations

import random
import time

from transformers import PreTrainedTokenizerBase

from inference.provisioning.prompting import chat_prompt_ids

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


def chat_messages(n: int) -> list[list[dict[str, str]]]:
    """The first n prompts (cycling) as OpenAI chat messages, for the HTTP peers."""
    return [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(n)]


def chat_texts(tokenizer: PreTrainedTokenizerBase, n: int, run: int | None = None) -> list[str]:
    """The first n prompts (cycling) rendered through the chat template, as text."""
    return [tokenizer.decode(ids) for ids in chat_prompts(tokenizer, n, run)]


def chat_prompts(
    tokenizer: PreTrainedTokenizerBase, n: int, run: int | None = None
) -> list[list[int]]:
    """The first n prompts (cycling) as chat-template token ids.

    With `run`, each prompt is numbered (n per run, so no two runs share a question): an
    engine that reuses what its KV cache still holds (Tandem, llama.cpp's server) then finds
    the template's system prompt and "Request " from earlier runs (26-27 of SmolLM2's 40-44
    tokens), as a chat service meets new questions, not the previous round's whole prompts.
    """
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    if run is not None:
        texts = [f"Request {run * n + i + 1}. {text}" for i, text in enumerate(texts)]
    return [chat_prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in texts]


def burst(n: int) -> list[float]:
    """Every request at once."""
    return [0.0] * n


def poisson(n: int, mean_gap: float, seed: int = 0) -> list[float]:
    """Arrival offsets of a Poisson process: the first at 0, then exponential gaps."""
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(n):
        offsets.append(now)
        now += rng.expovariate(1.0 / mean_gap)
    return offsets


def sleep_until(deadline: float) -> None:
    """Sleep until time.perf_counter() reaches `deadline`."""
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)
