"""Correctness of the step loop on tiny random models: HF parity, batch invariance, KV use."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from inference.engine import EngineObserver, FinishReason, SamplingParams
from tests.engine.helpers import WAIT, Recorder, generate_one, hf_greedy, sharpen, tiny_config

GREEDY_32 = SamplingParams(max_new_tokens=32, ignore_eos=True)


def prompts(count: int, vocab: int = 49152, seed: int = 3) -> list[list[int]]:
    """`count` random prompts of different lengths (3 to 60 tokens)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(3, 60, count).long().tolist()
    return [torch.randint(100, vocab, (n,), generator=generator).tolist() for n in lengths]


@pytest.mark.parametrize(
    ("model_class", "config_class", "extra"),
    [
        (LlamaForCausalLM, LlamaConfig, {}),
        (LlamaForCausalLM, LlamaConfig, {"attention_bias": True, "num_key_value_heads": 4}),
        (MistralForCausalLM, MistralConfig, {}),
        (Qwen2ForCausalLM, Qwen2Config, {}),
    ],
    ids=["llama-gqa", "llama-bias-mha", "mistral", "qwen2"],
)
def test_greedy_matches_hf_generate(
    model_class, config_class, extra, tokenizer, make_engine
) -> None:
    torch.manual_seed(0)
    model = sharpen(model_class(config_class(**tiny_config(**extra))))
    engine = make_engine(model, tokenizer, max_step_tokens=32, max_running=4)
    batch = prompts(3)
    results = engine.generate_batch(
        [(None, p, SamplingParams(max_new_tokens=24)) for p in batch], timeout=WAIT
    )
    for prompt, result in zip(batch, results, strict=True):
        assert result.token_ids == hf_greedy(model, prompt, 24)


def test_batch_invariance_with_staggered_joins(tiny_model, tokenizer, make_engine) -> None:
    """8 prompts, each joining two tokens after the previous one, match their solo runs."""
    engine = make_engine(tiny_model, tokenizer, max_step_tokens=40, max_running=8)
    batch = prompts(8)
    alone = [generate_one(engine, p, GREEDY_32).token_ids for p in batch]
    recorders = [Recorder() for _ in batch]
    joins: list[int] = []

    def chain(index: int):
        def on_event(event) -> None:
            recorders[index](event)
            if event.index == 1 and event.token_id is not None and index + 1 < len(batch):
                joins.append(engine.stats().steps)
                engine.submit(batch[index + 1], GREEDY_32, on_event=chain(index + 1))

        return on_event

    engine.submit(batch[0], GREEDY_32, on_event=chain(0))
    for recorder in recorders:
        recorder.wait()
    assert len(set(joins)) == len(batch) - 1, "each request should join at a different step"
    assert [r.token_ids for r in recorders] == alone
    for recorder, tokens in zip(recorders, alone, strict=True):
        assert recorder.text == tokenizer.decode(tokens, skip_special_tokens=True)


def test_joining_and_leaving_mid_flight_leaves_others_unchanged(
    tiny_model, tokenizer, make_engine
) -> None:
    """A long request keeps its output while others join, finish, get cancelled and move slots."""
    engine = make_engine(tiny_model, tokenizer, max_step_tokens=64, max_running=4)
    long_a, short_b, long_c, cancelled_d = prompts(4, seed=11)
    params_long = SamplingParams(max_new_tokens=40, ignore_eos=True)
    params_short = SamplingParams(max_new_tokens=5, ignore_eos=True)
    alone_a = generate_one(engine, long_a, params_long).token_ids
    alone_c = generate_one(engine, long_c, params_long).token_ids

    a, b, c, d = Recorder(), Recorder(), Recorder(), Recorder()
    moved_slots: list[int] = []

    def on_a(event) -> None:
        a(event)
        if event.index == 3 and not event.is_finished:
            engine.submit(short_b, params_short, on_event=b)
            engine.submit(long_c, params_long, on_event=c, request_id="c")
            engine.submit(cancelled_d, params_long, on_event=d, request_id="d")
        if event.index == 12 and not event.is_finished:
            engine.cancel("d")
        if event.index == 20 and not event.is_finished:
            seq = engine._active.get("c")
            moved_slots.append(seq.slot if seq is not None else -1)

    engine.submit(long_a, params_long, on_event=on_a)
    for recorder in (a, b, c, d):
        recorder.wait()
    assert d.events[-1].finish_reason is FinishReason.CANCELLED
    assert moved_slots == [1], "c should have been compacted from slot 2 into slot 1"
    assert a.token_ids == alone_a
    assert c.token_ids == alone_c


def test_chunked_prefill_matches_unchunked(tiny_model, tokenizer, make_engine) -> None:
    long_prompt = torch.randint(100, 49152, (330,), generator=torch.Generator().manual_seed(5))
    long_prompt = long_prompt.tolist()
    whole = make_engine(tiny_model, tokenizer, max_step_tokens=512, max_running=4)
    expected = generate_one(whole, long_prompt, GREEDY_32).token_ids

    class Steps(EngineObserver):
        def __init__(self) -> None:
            self.steps: list[tuple[int, int, int]] = []

        def on_step(self, batch_size, num_tokens, prefill_tokens, seconds) -> None:
            self.steps.append((batch_size, num_tokens, prefill_tokens))

    observer = Steps()
    chunked = make_engine(
        tiny_model, tokenizer, observer=observer, max_step_tokens=16, max_running=4
    )
    decoder = Recorder()
    started = threading.Event()

    def on_decoder(event) -> None:
        decoder(event)
        started.set()

    short = prompts(2, seed=6)[0]
    chunked.submit(short, SamplingParams(max_new_tokens=60, ignore_eos=True), on_event=on_decoder)
    assert started.wait(WAIT)
    result = chunked.generate_batch([(None, long_prompt, GREEDY_32)], timeout=WAIT)[0]
    decoder.wait()
    assert result.token_ids == expected
    assert all(tokens <= 16 for _, tokens, _ in observer.steps)
    prefill_steps = [s for s in observer.steps if s[2] > 0 and s[0] == 2]
    assert len(prefill_steps) >= len(long_prompt) // 16, "the long prompt went in chunks"
    assert all(n - p == 1 for _, n, p in prefill_steps), "the decoder decoded in every chunk step"


def test_finished_and_cancelled_requests_free_their_kv(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer, max_step_tokens=64, max_running=4)
    prompt = prompts(1, seed=9)[0]
    used_during: list[tuple[int, int]] = []
    recorder = Recorder()

    def on_event(event) -> None:
        recorder(event)
        if not event.is_finished:
            used_during.append((event.index, engine.stats().kv_tokens_used))
        if event.index == 4 and not event.is_finished:
            engine.cancel(event.request_id)

    engine.submit(prompt, SamplingParams(max_new_tokens=100, ignore_eos=True), on_event=on_event)
    final = recorder.wait()
    assert final.finish_reason is FinishReason.CANCELLED
    # When token i is emitted the cache holds the prompt and the i tokens fed before it.
    assert used_during == [(i, len(prompt) + i) for i in range(5)]
    stats = engine.stats()
    assert (stats.kv_tokens_used, stats.kv_slots_used, stats.running) == (0, 0, 0)

    results = engine.generate_batch(
        [(None, p, SamplingParams(max_new_tokens=8)) for p in prompts(3)], timeout=WAIT
    )
    assert all(r.finish_reason in (FinishReason.LENGTH, FinishReason.EOS_TOKEN) for r in results)
    stats = engine.stats()
    assert (stats.kv_tokens_used, stats.kv_slots_used, stats.running) == (0, 0, 0)
    assert stats.requests_finished == 4


def test_seeded_sampling_is_independent_of_batch_companions(
    tiny_model, tokenizer, make_engine
) -> None:
    engine = make_engine(tiny_model, tokenizer, max_step_tokens=64, max_running=8)
    prompt, *others = prompts(5, seed=21)

    def sampled(seed: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=32,
            do_sample=True,
            temperature=1.5,
            top_p=0.95,
            seed=seed,
            ignore_eos=True,
        )

    alone = generate_one(engine, prompt, sampled(1234)).token_ids
    companions = [(None, p, sampled(i)) for i, p in enumerate(others)]
    companions.insert(2, ("target", prompt, sampled(1234)))
    companions.append((None, others[0], SamplingParams(max_new_tokens=10)))
    together = {r.request_id: r for r in engine.generate_batch(companions, timeout=WAIT)}
    assert together["target"].token_ids == alone
    assert generate_one(engine, prompt, sampled(99)).token_ids != alone


def test_repetition_penalty_greedy_matches_hf(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer)
    prompt = prompts(1, seed=2)[0]
    params = SamplingParams(max_new_tokens=24, repetition_penalty=1.5)
    with torch.no_grad():
        output = tiny_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            repetition_penalty=1.5,
            pad_token_id=0,
        )
    assert generate_one(engine, prompt, params).token_ids == output[0, len(prompt) :].tolist()


def test_a_sampler_that_fails_ends_its_request_alone(
    tiny_model, tokenizer, make_engine, monkeypatch
) -> None:
    """A fault in one row's sampling (injected: nothing real makes the arithmetic raise)
    fails that request; the step's other rows are still sampled, as they would be alone."""
    from inference.engine import engine as engine_module
    from inference.engine.sampling import RequestSampler

    def broken(params: SamplingParams) -> bool:
        return params.seed == 666

    sample_rows, sample = engine_module.sample_rows, RequestSampler.sample

    def rows_or_fault(logits, samplers):
        if any(broken(sampler.params) for sampler in samplers):
            raise RuntimeError("injected sampling fault")
        return sample_rows(logits, samplers)

    def one_or_fault(self, logits):
        if broken(self.params):
            raise RuntimeError("injected sampling fault")
        return sample(self, logits)

    engine = make_engine(tiny_model, tokenizer, max_step_tokens=64, max_running=8)
    first, second = prompts(2, seed=5)

    def sampled(seed: int) -> SamplingParams:
        params = dict(do_sample=True, top_p=0.9, repetition_penalty=1.2, ignore_eos=True)
        return SamplingParams(max_new_tokens=12, seed=seed, **params)

    alone = generate_one(engine, first, sampled(7)).token_ids
    monkeypatch.setattr(engine_module, "sample_rows", rows_or_fault)
    monkeypatch.setattr(RequestSampler, "sample", one_or_fault)
    results = engine.generate_batch(
        [("good", first, sampled(7)), ("bad", second, sampled(666))], timeout=WAIT
    )
    by_id = {r.request_id: r for r in results}
    assert by_id["bad"].finish_reason is FinishReason.ERROR
    assert "injected sampling fault" in by_id["bad"].error
    assert by_id["good"].finish_reason is FinishReason.LENGTH
    assert by_id["good"].token_ids == alone
