"""A short prompt arriving during a decode step cuts in: the step gives way, the prompt's own
step runs, the decoders' step runs again, and nobody's tokens change."""

from __future__ import annotations

import time

from inference.engine import SamplingParams
from inference.engine.model_runner import LlamaRunner
from inference.engine.scheduler import BURST_WINDOW
from tests.engine.helpers import hf_greedy

DECODERS = ([5, 17, 300, 9001], [42, 7, 7, 1200, 77], [1000, 2000, 3000])
NEWCOMER = [11, 12, 13, 14, 15, 16]
NEW_TOKENS = 6


class ArrivalDuringStep:
    """Wraps a runner: on one chosen forward call, a request arrives before the model runs
    (as if submitted from another thread while the step was in flight)."""

    def __init__(self, inner: LlamaRunner, arrive) -> None:
        self.inner = inner
        self.arrive = arrive
        self.at_call: int | None = None
        self.calls = 0
        self.vocab_size = inner.vocab_size
        self.context_length = inner.context_length
        self.kv_spec = inner.kv_spec

    def forward(self, batch, cache):
        self.calls += 1
        if self.calls == self.at_call:
            self.arrive()
        return self.inner.forward(batch, cache)


def test_a_newcomer_cuts_into_the_decode_step_in_flight(tiny_model, tokenizer, make_engine):
    order: list[str] = []
    tokens: dict[str, list[int]] = {}

    def recorder(name: str):
        def on_event(event) -> None:
            if event.token_id is not None:
                order.append(name)
                tokens.setdefault(name, []).append(event.token_id)

        return on_event

    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    engine = None

    def arrive() -> None:
        engine.submit(NEWCOMER, params, on_event=recorder("newcomer"))

    runner = ArrivalDuringStep(LlamaRunner(tiny_model), arrive)
    engine = make_engine(tiny_model, tokenizer, runner=runner, start=False, max_running=4)
    # Step times as the compiled graphs would seed them: a prompt's step alone is allowed.
    engine.pacer.seed({rows: 0.01 for rows in (1, 2, 4, 8, 16, 32)})
    for index, prompt in enumerate(DECODERS):
        engine.submit(prompt, params, on_event=recorder(f"decoder{index}"))
    engine._step()  # the burst's prompts, together
    assert len(order) == len(DECODERS)
    time.sleep(BURST_WINDOW + 0.05)  # the newcomer is not one of the burst

    runner.at_call = runner.calls + 1
    order.clear()
    engine._step()
    assert order[0] == "newcomer", order
    assert sorted(order[1:]) == [f"decoder{i}" for i in range(len(DECODERS))]
    assert engine.stats().steps_interrupted == 1

    while engine.scheduler.has_work():
        engine._step()
    prompts = {"newcomer": NEWCOMER} | {f"decoder{i}": p for i, p in enumerate(DECODERS)}
    for name, prompt in prompts.items():
        assert tokens[name] == hf_greedy(tiny_model, prompt, NEW_TOKENS), name


def test_a_step_right_after_a_prompt_s_own_step_does_not_give_way(
    tiny_model, tokenizer, make_engine
):
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    engine = make_engine(tiny_model, tokenizer, start=False, max_running=4)
    engine.pacer.seed({rows: 0.01 for rows in (1, 2, 4, 8, 16, 32)})
    for prompt in DECODERS:
        engine.submit(prompt, params, on_event=lambda event: None)
    engine._step()
    time.sleep(BURST_WINDOW + 0.05)
    engine.submit(NEWCOMER, params, on_event=lambda event: None)
    alone = engine._schedule()
    assert alone is not None and alone.decode_slots == [] and alone.interrupt is None
    engine._run(alone)
    after = engine._schedule()
    assert after is not None and len(after.decode_slots) == len(DECODERS) + 1
    assert after.interrupt is None
    engine._run(after)
    assert engine._schedule().interrupt is not None
