"""Helpers for the engine tests: tiny model settings, fake runners, an event recorder."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch
from transformers import PreTrainedModel

from inference.engine import Engine, EngineEvent, GenerationResult, SamplingParams
from inference.engine.batch import StepBatch
from inference.engine.compiled_decode import _Linear
from inference.engine.kv_cache import KVCache, KVSpec
from inference.provisioning.loading import LoadedModel
from inference.provisioning.prompting import chat_prompt_ids

WAIT = 60.0
TINY_VOCAB = 49152


def tiny_config(**overrides: object) -> dict[str, object]:
    """Settings shared by the tiny random models (SmolLM2's vocabulary, 2 layers, GQA)."""
    settings: dict[str, object] = {
        "vocab_size": TINY_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": 0.2,
    }
    settings.update(overrides)
    return settings


def sharpen(model: PreTrainedModel) -> PreTrainedModel:
    """Scale the output head so random logits are far apart: no near-tie argmax flakiness."""
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def hf_greedy(model: PreTrainedModel, prompt: list[int], new_tokens: int) -> list[int]:
    """HF generate's greedy continuation (stops at the model's EOS, like the engine)."""
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return output[0, len(prompt) :].tolist()


def generate_one(engine: Engine, prompt: list[int], params: SamplingParams) -> GenerationResult:
    """Run one request alone and wait for it."""
    return engine.generate_batch([(None, prompt, params)], timeout=WAIT)[0]


class Recorder:
    """An on_event callback that keeps every event and signals the finish."""

    def __init__(self) -> None:
        self.events: list[EngineEvent] = []
        self.done = threading.Event()

    def __call__(self, event: EngineEvent) -> None:
        self.events.append(event)
        if event.is_finished:
            self.done.set()

    def wait(self) -> EngineEvent:
        assert self.done.wait(WAIT), "request did not finish in time"
        return self.events[-1]

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events if e.token_id is not None]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)


class ScriptedRunner:
    """A fake runner whose every sampling row forces the next token of a fixed script.

    All requests must have a prompt of `prompt_len` tokens: the output index of a decode row
    is its position + 1 - prompt_len. Lets text-level behaviour (detokenising, stops) be
    tested on chosen token sequences through the whole engine.
    """

    def __init__(self, script: list[int], prompt_len: int, context_length: int = 512) -> None:
        self.script = script
        self.prompt_len = prompt_len
        self.vocab_size = TINY_VOCAB
        self.context_length = context_length
        self.kv_spec = KVSpec(1, 1, 1, torch.float32, torch.device("cpu"))

    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        indices = [p + 1 - self.prompt_len for p in batch.decode_positions]
        indices += [0 for chunk in batch.chunks if chunk.needs_logits]
        logits = torch.zeros(len(indices), self.vocab_size)
        for row, index in enumerate(indices):
            logits[row, self.script[index % len(self.script)]] = 100.0
        return logits


class FlakyRunner:
    """Wraps a runner and raises on chosen forward calls (1-based): the fault-injection seam."""

    def __init__(self, inner: object, fail_calls: set[int]) -> None:
        self.inner = inner
        self.fail_calls = fail_calls
        self.calls = 0
        self.vocab_size = inner.vocab_size
        self.context_length = inner.context_length
        self.kv_spec = inner.kv_spec

    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        self.calls += 1
        if self.calls in self.fail_calls:
            raise RuntimeError(f"injected fault in step {self.calls}")
        return self.inner.forward(batch, cache)


def alone_and_together(
    engine: Engine, seed: int, lengths: Iterable[int], base: int, step: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy tokens of random prompts run one at a time, and the same run all together.

    Prompt i has lengths[i] random ids and asks for base + step·i tokens, EOS ignored: a
    batch-invariant engine gives each the same tokens both ways.
    """
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(100, 49152, (n,), generator=generator).tolist() for n in lengths]
    requests = [
        (None, p, SamplingParams(max_new_tokens=base + step * i, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]
    alone = [engine.generate_batch([r], timeout=WAIT)[0].token_ids for r in requests]
    together = [r.token_ids for r in engine.generate_batch(requests, timeout=WAIT)]
    return alone, together


def canonical_answer(loaded: LoadedModel, runner: object) -> str:
    """The greedy reply (16 tokens) to the suite's canonical question on an engine over
    `runner`: the real model on some weights should still say "Paris"."""
    engine = Engine(loaded.model, loaded.tokenizer, runner=runner).start()
    try:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        prompt = chat_prompt_ids(loaded.tokenizer, messages)
        result = engine.generate_batch([(None, prompt, SamplingParams(max_new_tokens=16))], WAIT)
    finally:
        engine.shutdown()
    return result[0].text


def compiled_matches_eager(model: PreTrainedModel, tokenizer, runner, make_engine) -> list:
    """Greedy tokens of an eager engine, then of the same runner compiled at buckets 1 and 2,
    asserted equal; returns the compiled graphs' linears."""
    request = [(None, [5, 600, 7000], SamplingParams(max_new_tokens=10))]
    eager = make_engine(model, tokenizer, runner=runner, max_running=2)
    expected = eager.generate_batch(request, WAIT)[0].token_ids
    eager.shutdown()
    runner.compile_decode((1, 2)).join()
    assert runner.compile_state == "ready", runner.compile_state
    engine = make_engine(model, tokenizer, runner=runner, max_running=2)
    assert engine.generate_batch(request, WAIT)[0].token_ids == expected
    return [m for m in runner.stack.modules() if isinstance(m, _Linear)]
