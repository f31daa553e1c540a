"""A short prompt arriving during a decode step runs inside it: the step pauses at the next
layer, the prompt's own step runs, the decoders' step goes on (or starts over when the
prompt's step moved the cache's rows), and nobody's tokens change."""

from __future__ import annotations

import time

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.model_runner import LlamaRunner
from inference.engine.scheduler import BURST_WINDOW
from tests.engine.helpers import hf_greedy

DECODERS = ([5, 17, 300, 9001], [42, 7, 7, 1200, 77], [1000, 2000, 3000])
NEWCOMER = [11, 12, 13, 14, 15, 16]
ENDS_AT_ONCE = [21, 22, 23]  # shorter: admitted first, to the lower slot
NEW_TOKENS = 6
PARAMS = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)


class ArrivalDuringStep:
    """Wraps a runner: in one chosen forward call, requests arrive as that step reaches
    `layer` (as if submitted from another thread while the step was in flight).

    At layer 0 they arrive as the step starts: the engine's arrival flag is set before the
    first layer's attention, where the C++ op reads it. A later layer is reached through
    `interrupt`, which only a step on the Python attention path asks at every layer."""

    def __init__(self, inner: LlamaRunner, arrive, layer: int) -> None:
        self.inner = inner
        self.arrive = arrive
        self.layer = layer
        self.at_call: int | None = None
        self.calls = 0
        self.vocab_size = inner.vocab_size
        self.context_length = inner.context_length
        self.kv_spec = inner.kv_spec

    def forward(self, batch, cache):
        self.calls += 1
        if self.calls == self.at_call and batch.interrupt is not None and self.layer == 0:
            self.arrive()
        elif self.calls == self.at_call and batch.interrupt is not None:
            ask = batch.interrupt

            def arriving(layer: int) -> bool:
                if layer == self.layer:
                    self.arrive()
                return ask(layer)

            batch.interrupt = arriving
        return self.inner.forward(batch, cache)


class Record:
    """on_event callbacks (`record(name)`) that note who got a token, in order, and each
    one's tokens."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.tokens: dict[str, list[int]] = {}

    def __call__(self, name: str):
        def on_event(event) -> None:
            if event.token_id is not None:
                self.order.append(name)
                self.tokens.setdefault(name, []).append(event.token_id)

        return on_event


def decoding_engine(
    model, tokenizer, make_engine, arrive, layer: int, record, decoders=DECODERS, inner=None
):
    """An engine (not started) on `inner` (default: the model's eager runner) wrapped in
    ArrivalDuringStep, whose `decoders` (on_event: `record`) have had their prompts' step
    and arrived as a burst that is over; the engine and the wrapper."""
    runner = ArrivalDuringStep(inner or LlamaRunner(model), arrive, layer)
    engine = make_engine(model, tokenizer, runner=runner, start=False, max_running=6)
    # Step times as the compiled graphs would seed them: a prompt's step alone is allowed.
    engine.pacer.seed({rows: 0.01 for rows in (1, 2, 4, 8, 16, 32)})
    for index, prompt in enumerate(decoders):
        engine.submit(prompt, PARAMS, on_event=record(f"decoder{index}"))
    with torch.inference_mode():  # as the engine's loop runs its steps
        engine._step()  # the burst's prompts, together
    time.sleep(BURST_WINDOW + 0.05)  # a newcomer is not one of the burst
    runner.at_call = runner.calls + 1
    return engine, runner


@pytest.mark.parametrize("layer", [0, 1])
def test_a_newcomer_runs_inside_the_decode_step_in_flight(
    tiny_model, tokenizer, make_engine, layer
):
    record = Record()
    order, tokens = record.order, record.tokens
    engine = None

    def arrive() -> None:
        engine.submit(NEWCOMER, PARAMS, on_event=record("newcomer"))

    engine, runner = decoding_engine(tiny_model, tokenizer, make_engine, arrive, layer, record)
    assert len(order) == len(DECODERS)
    order.clear()
    engine._step()
    assert order[0] == "newcomer", order
    assert sorted(order[1:]) == [f"decoder{i}" for i in range(len(DECODERS))]
    assert engine.stats().steps_interrupted == 1
    assert runner.calls == runner.at_call + 1  # the newcomer's step, inside: nothing redone

    while engine.scheduler.has_work():
        engine._step()
    prompts = {"newcomer": NEWCOMER} | {f"decoder{i}": p for i, p in enumerate(DECODERS)}
    for name, prompt in prompts.items():
        assert tokens[name] == hf_greedy(tiny_model, prompt, NEW_TOKENS), name


def test_a_step_whose_rows_the_newcomers_step_moved_starts_over(tiny_model, tokenizer, make_engine):
    """Two newcomers: the shorter (admitted first) ends with its first token, so its slot is
    freed and the other's rows move into it; the decoders' step, planned before, runs again."""
    record = Record()
    order, tokens = record.order, record.tokens
    engine = None

    def arrive() -> None:
        one = SamplingParams(max_new_tokens=1, ignore_eos=True)
        engine.submit(NEWCOMER, PARAMS, on_event=record("newcomer"))
        engine.submit(ENDS_AT_ONCE, one, on_event=record("ends"))

    engine, runner = decoding_engine(tiny_model, tokenizer, make_engine, arrive, 1, record)
    version = engine.cache.layout_version
    order.clear()
    engine._step()
    assert sorted(order[:2]) == ["ends", "newcomer"], order
    assert sorted(order[2:]) == [f"decoder{i}" for i in range(len(DECODERS))]
    assert engine.cache.layout_version > version
    assert runner.calls == runner.at_call + 2  # the newcomers' step, then the step again

    while engine.scheduler.has_work():
        engine._step()
    assert tokens["ends"] == hf_greedy(tiny_model, ENDS_AT_ONCE, 1)
    assert tokens["newcomer"] == hf_greedy(tiny_model, NEWCOMER, NEW_TOKENS)
    for index, prompt in enumerate(DECODERS):
        assert tokens[f"decoder{index}"] == hf_greedy(tiny_model, prompt, NEW_TOKENS)


def test_a_step_right_after_a_prompt_s_own_step_does_not_give_way(
    tiny_model, tokenizer, make_engine
):
    engine = make_engine(tiny_model, tokenizer, start=False, max_running=4)
    engine.pacer.seed({rows: 0.01 for rows in (1, 2, 4, 8, 16, 32)})
    for prompt in DECODERS:
        engine.submit(prompt, PARAMS, on_event=lambda event: None)
    engine._step()
    time.sleep(BURST_WINDOW + 0.05)
    engine.submit(NEWCOMER, PARAMS, on_event=lambda event: None)
    alone = engine._schedule()
    assert alone is not None and alone.decode_slots == [] and alone.interrupt is None
    engine._run(alone)
    after = engine._schedule()
    assert after is not None and len(after.decode_slots) == len(DECODERS) + 1
    assert after.interrupt is None
    engine._run(after)
    assert engine._schedule().interrupt is not None
