"""The step's attention op in C++ (step_attention.cpp): a view step attends there, the same bits
as the step's Python `attend`, without calling it, padded rows included; a step a newcomer may
cut into (the engine's arrival flag set), or any other step, calls `attend` at every layer; the
flag's C++ twin follows it."""

from __future__ import annotations

import dataclasses

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.compiled_decode import StepPlan, run_stack
from inference.engine.kv_cache import KVCache
from inference.engine.model_runner import LlamaRunner
from inference.engine.native_build import native_module
from inference.engine.step_attention import ArrivalFlag, loaded_module, step_op
from tests.engine.helpers import sharpen, tiny_config

LENGTHS = (5, 9, 3)


def runner_on_the_module() -> LlamaRunner:
    torch.manual_seed(4)
    runner = LlamaRunner(sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config()))))
    native_module()
    assert runner._native_attention() is not None
    return runner


def decoding(runner: LlamaRunner, chunk: bool = False) -> tuple[KVCache, StepBatch]:
    """A cache whose slots 0..2 hold random K/V of LENGTHS, and their decode step (plus a
    prompt chunk in slot 3 with `chunk`)."""
    cache = KVCache(runner.kv_spec, max_slots=4, max_seq_len=64, initial_capacity=64)
    for length in LENGTHS:
        cache.extend(cache.allocate(), length)
    for layer in range(runner.kv_spec.num_layers):
        cache.layer(layer).normal_(generator=torch.Generator().manual_seed(layer))
    batch = StepBatch(
        decode_slots=[0, 1, 2],
        decode_token_ids=[101, 202, 303],
        decode_positions=[length - 1 for length in LENGTHS],
    )
    if chunk:
        slot = cache.allocate()
        cache.extend(slot, 4)
        batch.chunks.append(PrefillChunk(slot, 0, [7, 8, 9, 10], needs_logits=True))
    return cache, batch


class Counted:
    """The step's Python `attend`, counting its calls."""

    def __init__(self, step: StepPlan) -> None:
        self.attend = step.attend
        self.calls = 0

    def __call__(self, q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        self.calls += 1
        return self.attend(q, kv, layer)


def run(runner: LlamaRunner, step: StepPlan, rows: int | None = None) -> tuple[torch.Tensor, int]:
    """The step's logits through the eager stack (on the op as a graph calls it), and how
    many times its Python `attend` ran."""
    counted = Counted(step)
    step = dataclasses.replace(step, attend=counted)
    with torch.inference_mode():
        logits = run_stack(runner.stack, step, rows or len(step.token_ids), len(step.logit_rows))
    return logits, counted.calls


def test_a_view_step_attends_in_cpp_the_same_bits_as_in_python() -> None:
    runner = runner_on_the_module()
    assert step_op() is not None
    cache, batch = decoding(runner)
    with torch.inference_mode():
        step = runner._step_plan(batch, cache)
    assert step.view is not None
    layers = runner.kv_spec.num_layers
    in_cpp, calls = run(runner, step)
    assert calls == 0
    in_python, calls = run(runner, dataclasses.replace(step, view=None))
    assert calls == layers
    assert torch.equal(in_cpp, in_python)
    # A bucket of 8 rows: 5 rows of padding, whose attention comes back as zeros.
    padded, calls = run(runner, step, rows=8)
    assert calls == 0
    padded_in_python, _ = run(runner, dataclasses.replace(step, view=None), rows=8)
    assert torch.equal(padded, padded_in_python)


def test_a_step_a_newcomer_may_cut_into_asks_python_while_the_flag_is_set() -> None:
    runner = runner_on_the_module()
    cache, batch = decoding(runner)
    asked: list[int] = []

    def interrupt(layer: int) -> bool:
        asked.append(layer)
        return False

    flag = ArrivalFlag()
    batch.interrupt, batch.arrivals = interrupt, flag
    with torch.inference_mode():
        step = runner._step_plan(batch, cache)
    quiet, calls = run(runner, step)
    assert calls == 0 and asked == []
    flag.set()
    arrived, calls = run(runner, step)
    layers = runner.kv_spec.num_layers
    assert calls == layers and asked == list(range(layers))
    assert torch.equal(quiet, arrived)
    # Without the flag the C++ op cannot tell: every layer asks.
    asked.clear()
    _, calls = run(runner, dataclasses.replace(step, arrivals=None))
    assert calls == layers and asked == list(range(layers))


def test_a_step_with_a_prompt_chunk_attends_in_python() -> None:
    runner = runner_on_the_module()
    cache, batch = decoding(runner, chunk=True)
    with torch.inference_mode():
        step = runner._step_plan(batch, cache)
    assert step.view is None
    _, calls = run(runner, step)
    assert calls == runner.kv_spec.num_layers


def test_the_flags_cpp_twin_follows_it() -> None:
    module = loaded_module()
    assert module is not None or native_module() is not None
    module = loaded_module()
    flag = ArrivalFlag()
    flag.set()
    twin = flag.native(module)
    assert twin.is_set() and flag.native(module) is twin
    flag.clear()
    assert not twin.is_set() and not flag.is_set()
    flag.set()
    assert twin.is_set()
