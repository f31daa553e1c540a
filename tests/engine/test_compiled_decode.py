"""The compiled decode step: parity with the eager step, batch invariance, every bucket built
at start and none after, and the eager fallback when the compiler fails. Tiny models, small
buckets."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import inference.engine.compiled_decode as compiled_decode
from inference.engine import SamplingParams
from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.compiled_decode import _Linear, gemm_templates, template_rows
from inference.engine.kv_cache import KVCache
from inference.engine.model_runner import LlamaRunner
from inference.engine.weights.choice import build_runner
from tests.engine.helpers import WAIT, alone_and_together, hf_greedy, sharpen, tiny_config
from tests.engine.test_cut_in import PARAMS, Record, decoding_engine
from tests.engine.test_engine_int8 import ALWAYS_INT8, tiny_bf16
from tests.engine.test_engine_q4 import tiny_q4

BUCKETS = (1, 2, 4)


@pytest.fixture(scope="module")
def compiled_runner() -> LlamaRunner:
    """A tiny float32 Llama whose decode step is compiled for BUCKETS (built once)."""
    torch.manual_seed(1)
    model = sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config())))
    runner = LlamaRunner(model)
    runner.compile_decode(BUCKETS).join()
    assert runner.compile_state == "ready", runner.compile_state
    return runner


def test_compiled_greedy_matches_hf_and_builds_nothing_later(
    compiled_runner, tokenizer, make_engine, monkeypatch
):
    """Every bucket was built at start; decode steps of 1 to 6 rows (6: eager) build none."""
    model = compiled_runner.model
    assert set(compiled_runner.compile_seconds) == set(BUCKETS)
    assert {s["state"] for s in compiled_runner.compile_buckets.values()} == {"built"}

    def no_build(*args, **kwargs):
        raise AssertionError("a bucket was built after start")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_build)
    engine = make_engine(model, tokenizer, runner=compiled_runner, max_running=6)
    prompts = [[5, 600, 7000], list(range(300, 320)), [42] * 7, [9, 8, 7, 6], [1000], [77, 78]]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    for count in (1, 3, 6):
        results = engine.generate_batch([(None, p, params) for p in prompts[:count]], WAIT)
        for prompt, result in zip(prompts, results, strict=False):
            assert result.token_ids == hf_greedy_no_eos(model, prompt, 12)
    assert engine.stats().steps > 0
    assert compiled_runner.compile_state == "ready"


def hf_greedy_no_eos(model, prompt: list[int], new_tokens: int) -> list[int]:
    """HF greedy with EOS ignored, like `ignore_eos=True`."""
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return output[0, len(prompt) :].tolist()


def test_a_step_runs_in_the_cheapest_timed_bucket_holding_it(
    compiled_runner, tokenizer, make_engine, monkeypatch
):
    """Once every bucket is timed, a larger bucket that stepped faster takes the smaller
    one's steps (on AMX the 8-row q8 graph cost more than the 16-row dense one), and the
    tokens stay HF's; one within the margin does not."""
    compiled = compiled_runner.compiled
    assert compiled.ready
    monkeypatch.setattr(compiled, "step_seconds", {1: 0.010, 2: 0.020, 4: 0.012})
    assert [compiled.bucket(rows) for rows in (1, 2, 3, 4)] == [1, 4, 4, 4]
    used = []
    run_stack = compiled_decode.run_stack
    monkeypatch.setattr(
        compiled_decode,
        "run_stack",
        lambda stack, step, rows, picks: used.append(rows) or run_stack(stack, step, rows, picks),
    )
    engine = make_engine(compiled_runner.model, tokenizer, runner=compiled_runner, max_running=2)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    prompts = [[5, 600, 7000], [42] * 7]
    results = engine.generate_batch([(None, p, params) for p in prompts], WAIT)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == hf_greedy_no_eos(compiled_runner.model, prompt, 6)
    assert 4 in used and 2 not in used
    compiled.step_seconds[2] = 0.0125  # within the margin: the smaller bucket keeps its steps
    assert compiled.bucket(2) == 2


def test_compiled_batch_invariance(compiled_runner, tokenizer, make_engine):
    """A request's greedy tokens do not depend on its companions in the compiled buckets."""
    engine = make_engine(compiled_runner.model, tokenizer, runner=compiled_runner, max_running=4)
    alone, together = alone_and_together(engine, 3, (3, 9, 17), 6, 4)
    assert together == alone


def test_a_newcomer_runs_inside_a_compiled_step(compiled_runner, tokenizer, make_engine):
    """The newcomer's step (a graph too) runs from inside the decoders' graph, before its
    first layer's attention, and the decoders' graph goes on; every request's tokens are HF's."""
    model = compiled_runner.model
    record = Record()
    newcomer, decoders = [11, 12], ([5, 17, 300], [42, 7])
    engine = None

    def arrive() -> None:
        engine.submit(newcomer, PARAMS, on_event=record("newcomer"))

    engine, runner = decoding_engine(
        model, tokenizer, make_engine, arrive, 0, record, decoders, compiled_runner
    )
    with torch.inference_mode():  # as the engine's loop runs its steps
        engine._step()
        assert engine.stats().steps_interrupted == 1
        assert runner.calls == runner.at_call + 1
        while engine.scheduler.has_work():
            engine._step()
    new_tokens = PARAMS.max_new_tokens
    assert record.tokens["newcomer"] == hf_greedy_no_eos(model, newcomer, new_tokens)
    for index, prompt in enumerate(decoders):
        assert record.tokens[f"decoder{index}"] == hf_greedy_no_eos(model, prompt, new_tokens)
    assert compiled_runner.compile_state == "ready"


def test_the_warm_up_measures_a_chunks_attention_per_key_and_seeds_the_pacer(
    compiled_runner, tokenizer, make_engine
):
    """A prompt chunk's attention over 1,024 keys costs more than over 8: the probe reads a
    positive cost per key, which the engine's pacer takes as its floor once it seeds."""
    runner = LlamaRunner(
        sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config(max_position_embeddings=4096))))
    )
    with torch.inference_mode():
        assert runner.chunk_key_seconds() > 0
    key_seconds = compiled_runner.compiled.key_seconds
    assert key_seconds is not None and key_seconds > 0
    engine = make_engine(compiled_runner.model, tokenizer, runner=compiled_runner)
    engine.generate_batch([(None, [5, 6, 7], SamplingParams(max_new_tokens=2))], WAIT)
    assert engine.pacer.key_floor == key_seconds


def test_q4_compiles_on_the_int4_kernel(tmp_path, tokenizer, make_engine):
    """q4 weights (int4 layers, int8 head) compile too; greedy equals their eager run's."""
    model, path = tiny_q4(tmp_path)
    runner = build_runner(model, "q4", path, max_rows=8)
    eager, compiled = eager_then_compiled(runner, tokenizer, make_engine, (1, 2))
    assert compiled == eager


def eager_then_compiled(
    runner: LlamaRunner, tokenizer, make_engine, buckets: tuple[int, ...]
) -> tuple[list[int], list[int]]:
    """One greedy request's tokens on the runner's eager step, then on its graphs for
    `buckets` (built here)."""
    request = [(None, [5, 600, 7000], SamplingParams(max_new_tokens=10))]
    eager = make_engine(runner.model, tokenizer, runner=runner, max_running=2)
    expected = eager.generate_batch(request, WAIT)[0].token_ids
    eager.shutdown()
    runner.compile_decode(buckets).join()
    assert runner.compile_state == "ready", runner.compile_state
    engine = make_engine(runner.model, tokenizer, runner=runner, max_running=2)
    return expected, engine.generate_batch(request, WAIT)[0].token_ids


@pytest.mark.skipif(
    not gemm_templates(torch.device("cpu")), reason="no AMX here: graphs keep the eager crossover"
)
def test_on_amx_the_graphs_multiply_by_the_int8_weights_at_every_bucket():
    """Eager steps stay on the dense packing (crossover 0 rows), but the graphs run the int8
    packing on inductor's template. The dense packing is zeroed to tell them apart: a
    compiled step's logits are the eager int8 kernel's, an eager one's are not."""
    model = tiny_bf16()
    reference = build_runner(model, "int8", None, max_rows=ALWAYS_INT8)
    runner = build_runner(model, "int8", None, max_rows=0)
    linears = [m for m in runner.stack.modules() if isinstance(m, _Linear) and m.kind == "int8"]
    for linear in linears:
        linear.weight.data.zero_()
    runner.compile_decode((1, 2, 4, 8)).join()
    assert runner.compile_state == "ready", runner.compile_state
    assert {(m.max_rows, m.compiled_max_rows) for m in linears} == {(0, 8)}
    batch = StepBatch(chunks=[PrefillChunk(0, 0, [5, 600, 7000, 31, 2], needs_logits=True)])
    with torch.inference_mode():
        expected = reference.forward(batch, KVCache(reference.kv_spec, 1, 64))
        compiled = runner.forward(batch, KVCache(runner.kv_spec, 1, 64))
        runner.compiled = None
        eager = runner.forward(batch, KVCache(runner.kv_spec, 1, 64))

    def off(logits: torch.Tensor) -> float:
        return float((logits - expected).norm() / expected.norm())

    assert off(compiled) < 0.02
    assert off(eager) > 0.5


def test_the_template_is_timed_on_the_weight_only_buckets(monkeypatch):
    """AMX: every bucket; another AVX-512 CPU: up to the eager crossover (above it the
    template lost to dense bf16 there); no AVX-512 (not measured) or dense weights: none.
    The CPU's features are faked: this machine has one kind."""
    cpu = torch.device("cpu")
    for amx, avx512, expected in ((True, True, 512), (False, True, 8), (False, False, 0)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda avx512=avx512: avx512)
        assert template_rows(cpu, 8, 512) == expected
    assert template_rows(cpu, 0, 512) == 0
    assert template_rows(torch.device("meta"), 8, 512) == 0


def test_int8_graphs_timed_on_the_template_keep_the_int8_kernels_tokens(
    tokenizer, make_engine, caplog
):
    """int8 buckets up to the crossover, built with their matmuls timed on the C++ template
    where this CPU allows it (either kernel may win a shape), answer as the eager int8 step."""
    runner = build_runner(tiny_bf16(), "int8", None, max_rows=2)
    with caplog.at_level(logging.INFO, logger=compiled_decode.__name__):
        eager, compiled = eager_then_compiled(runner, tokenizer, make_engine, (1, 2, 4))
    assert compiled == eager
    timed = template_rows(torch.device("cpu"), 2, 4)
    assert runner.compiled.template_rows == timed
    on_template = [r.getMessage() for r in caplog.records if "C++ template" in r.getMessage()]
    assert len(on_template) == len([b for b in (1, 2, 4) if b <= timed])


def test_a_compiler_failure_leaves_the_engine_eager(monkeypatch, caplog, tokenizer, make_engine):
    """The ahead-of-time compiler raising (no C++ compiler here) is said once; replies still
    come, eagerly."""
    torch.manual_seed(2)
    model = sharpen(LlamaForCausalLM(LlamaConfig(**tiny_config())))

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compiler)
    runner = LlamaRunner(model)
    with caplog.at_level(logging.WARNING):
        runner.compile_decode(BUCKETS).join()
    assert runner.compile_state.startswith("failed: RuntimeError: no C++ compiler found")
    assert runner.compiled is None
    warnings = [r for r in caplog.records if "compiled decode unavailable" in r.getMessage()]
    assert len(warnings) == 1
    engine = make_engine(model, tokenizer, runner=runner, max_running=2)
    prompt = [5, 600, 7000]
    result = engine.generate_batch([(None, prompt, SamplingParams(max_new_tokens=8))], WAIT)[0]
    assert result.token_ids == hf_greedy(model, prompt, 8)


def test_a_failing_compiled_step_falls_back_for_good(
    compiled_runner, tokenizer, make_engine, monkeypatch
):
    """A compiled step that raises is rerun eagerly; the runner stays eager afterwards."""
    model = compiled_runner.model
    runner = LlamaRunner(model)
    runner.compiled, runner.compile_state = compiled_runner.compiled, "ready"

    def broken(*args, **kwargs):
        raise RuntimeError("graph fault")

    monkeypatch.setattr(runner.compiled, "run", broken)
    engine = make_engine(model, tokenizer, runner=runner, max_running=2)
    prompt = [5, 600, 7000]
    result = engine.generate_batch([(None, prompt, SamplingParams(max_new_tokens=8))], WAIT)[0]
    assert result.finish_reason.value != "error"
    assert result.token_ids == hf_greedy(model, prompt, 8)
    assert runner.compiled is None
    assert runner.compile_state == "failed: RuntimeError: graph fault"
