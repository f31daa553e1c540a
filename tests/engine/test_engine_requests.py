"""Request control: validation, capping, queue bounds, cancel, stops, faults, observers."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from inference.engine import (
    Engine,
    EngineConfig,
    EngineObserver,
    EngineStopped,
    FinishReason,
    InvalidRequest,
    LlamaRunner,
    Overloaded,
    PromptTooLong,
    SamplingParams,
    UnsupportedModel,
)
from tests.engine.helpers import (
    WAIT,
    FlakyRunner,
    Recorder,
    ScriptedRunner,
    generate_one,
    tiny_config,
)

PROMPT = list(range(1000, 1010))


def test_prompt_too_long_is_refused_unless_truncation_is_asked(
    tiny_model, tokenizer, make_engine
) -> None:
    engine = make_engine(tiny_model, tokenizer, max_seq_len=64)
    prompt = list(range(1000, 1100))
    with pytest.raises(PromptTooLong) as refused:
        engine.submit(prompt, SamplingParams(), on_event=Recorder())
    assert isinstance(refused.value, InvalidRequest)
    assert (refused.value.prompt_tokens, refused.value.max_prompt_tokens) == (100, 63)

    params = SamplingParams(max_new_tokens=8, truncate_prompt_tokens=20, ignore_eos=True)
    truncated = generate_one(engine, prompt, params)
    assert truncated.usage.prompt_tokens == 20
    plain = SamplingParams(max_new_tokens=8, ignore_eos=True)
    assert truncated.token_ids == generate_one(engine, prompt[-20:], plain).token_ids


def test_max_new_tokens_is_capped_by_the_context_window(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer, max_seq_len=64)
    result = generate_one(
        engine, list(range(1000, 1060)), SamplingParams(max_new_tokens=100, ignore_eos=True)
    )
    assert result.finish_reason is FinishReason.LENGTH
    assert result.usage.completion_tokens == 4
    assert result.usage.total_tokens == 64


def test_max_new_tokens_finishes_with_length(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer)
    result = generate_one(engine, PROMPT, SamplingParams(max_new_tokens=7, ignore_eos=True))
    assert (result.finish_reason, len(result.token_ids)) == (FinishReason.LENGTH, 7)
    assert result.text == tokenizer.decode(result.token_ids, skip_special_tokens=True)


def test_invalid_prompts_are_refused(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer, start=False)
    for bad in ([], [49152], [-1], ["a"]):
        with pytest.raises(InvalidRequest):
            engine.submit(bad, on_event=Recorder())
    engine.submit(PROMPT, on_event=Recorder(), request_id="same")
    with pytest.raises(InvalidRequest):
        engine.submit(PROMPT, on_event=Recorder(), request_id="same")


def test_full_waiting_queue_raises_overloaded_with_retry_hint(
    tiny_model, tokenizer, make_engine
) -> None:
    engine = make_engine(tiny_model, tokenizer, start=False, max_waiting=2)
    first, second = Recorder(), Recorder()
    params = SamplingParams(max_new_tokens=3)
    engine.submit(PROMPT, params, on_event=first)
    engine.submit(PROMPT, params, on_event=second)
    with pytest.raises(Overloaded) as refused:
        engine.submit(PROMPT, params, on_event=Recorder())
    assert refused.value.retry_after >= 1.0
    assert refused.value.waiting == 2
    with pytest.raises(Overloaded):
        engine.generate_batch([(None, PROMPT, params)], timeout=1)
    assert engine.stats().waiting == 2
    engine.start()
    assert first.wait().is_finished and second.wait().is_finished


def test_cancel_takes_effect_before_the_next_step(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer)
    recorder = Recorder()

    def on_event(event) -> None:
        recorder(event)
        if event.index == 0 and not event.is_finished:
            assert engine.cancel(event.request_id)

    engine.submit(PROMPT, SamplingParams(max_new_tokens=50, ignore_eos=True), on_event=on_event)
    final = recorder.wait()
    assert [e.token_id is not None for e in recorder.events] == [True, False]
    assert final.finish_reason is FinishReason.CANCELLED
    assert final.usage.completion_tokens == 1
    assert final.full_text == recorder.events[0].text
    assert not engine.cancel(final.request_id), "a finished request cannot be cancelled again"


def test_cancel_of_a_waiting_request(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer, start=False)
    recorder = Recorder()
    request_id = engine.submit(PROMPT, SamplingParams(), on_event=recorder)
    assert engine.cancel(request_id)
    engine.start()
    final = recorder.wait()
    assert final.finish_reason is FinishReason.CANCELLED
    assert final.timings.first_token_at is None and final.timings.ttft is None
    assert final.usage.completion_tokens == 0
    assert engine.stats().waiting == 0


def scripted_engine(make_engine, tokenizer, text: str, **config: object) -> Engine:
    script = tokenizer.encode(text, add_special_tokens=False)
    runner = ScriptedRunner(script, prompt_len=len(PROMPT))
    return make_engine(None, tokenizer, runner=runner, **config)


def test_stop_sequence_is_held_back_and_never_shown(tokenizer, make_engine) -> None:
    text = "The answer is 42</answer> and then more text"
    engine = scripted_engine(make_engine, tokenizer, text)
    recorder = Recorder()
    params = SamplingParams(max_new_tokens=40, stop=("</answer>",))
    engine.submit(PROMPT, params, on_event=recorder)
    final = recorder.wait()
    assert final.finish_reason is FinishReason.STOP_SEQUENCE
    assert recorder.text == final.full_text == "The answer is 42"
    held = [e for e in recorder.events if e.token_id is not None and e.text == ""]
    assert held, "the tokens of '</answer>' were held back while unresolved"
    assert all("<" not in e.text for e in recorder.events)
    assert final.usage.completion_tokens == len(recorder.token_ids)
    assert engine.stats().kv_tokens_used == 0


def test_partial_stop_match_is_released_when_it_does_not_complete(tokenizer, make_engine) -> None:
    text = "a </b> c </answ d"
    engine = scripted_engine(make_engine, tokenizer, text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    params = SamplingParams(max_new_tokens=len(ids), stop=("</answer>",))
    result = generate_one(engine, PROMPT, params)
    assert result.finish_reason is FinishReason.LENGTH
    assert result.text == text


def test_stream_of_korean_and_emoji_has_no_replacement_chars(tokenizer, make_engine) -> None:
    text = "안녕하세요 👋🏽 世界"
    ids = tokenizer.encode(text, add_special_tokens=False)
    engine = scripted_engine(make_engine, tokenizer, text)
    recorder = Recorder()
    engine.submit(PROMPT, SamplingParams(max_new_tokens=len(ids)), on_event=recorder)
    final = recorder.wait()
    assert recorder.token_ids == ids
    assert all("\ufffd" not in e.text for e in recorder.events)
    assert recorder.text == final.full_text == tokenizer.decode(ids, skip_special_tokens=True)
    assert any(e.text == "" for e in recorder.events[:-1]), "split characters were withheld"


def test_eos_finishes_with_eos_token_and_hides_it(tokenizer, make_engine) -> None:
    engine = scripted_engine(make_engine, tokenizer, "Bye<|im_end|> never")
    recorder = Recorder()
    engine.submit(PROMPT, SamplingParams(max_new_tokens=20), on_event=recorder)
    final = recorder.wait()
    assert final.finish_reason is FinishReason.EOS_TOKEN
    assert final.token_id == 2 and final.special
    assert final.full_text == recorder.text == "Bye"


def test_a_failing_step_fails_only_its_requests(tiny_model, tokenizer, make_engine) -> None:
    runner = FlakyRunner(LlamaRunner(tiny_model), fail_calls={3})
    engine = make_engine(tiny_model, tokenizer, runner=runner, max_running=2, start=False)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    a, b, waiting = Recorder(), Recorder(), Recorder()
    for recorder in (a, b, waiting):
        engine.submit(PROMPT, params, on_event=recorder)
    engine.start()
    for recorder in (a, b):
        final = recorder.wait()
        assert final.finish_reason is FinishReason.ERROR
        assert "injected fault in step 3" in final.error
        assert len(recorder.token_ids) == 2
    assert waiting.wait().finish_reason is FinishReason.LENGTH
    stats = engine.stats()
    assert (stats.kv_tokens_used, stats.kv_slots_used) == (0, 0)

    after = generate_one(engine, PROMPT, params)
    assert after.finish_reason is FinishReason.LENGTH
    assert after.token_ids == waiting.token_ids


def test_a_raising_callback_cancels_only_its_request(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer)
    seen = Recorder()

    def explode(event) -> None:
        seen(event)
        if not event.is_finished:
            raise ValueError("client went away")

    engine.submit(PROMPT, SamplingParams(max_new_tokens=30, ignore_eos=True), on_event=explode)
    assert seen.wait().finish_reason is FinishReason.CANCELLED
    assert len(seen.token_ids) == 1
    result = generate_one(engine, PROMPT, SamplingParams(max_new_tokens=4))
    assert len(result.token_ids) == 4


class CountingObserver(EngineObserver):
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.finished = threading.Event()
        self.reasons: list[FinishReason] = []

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def on_admit(self, request_id, queue_time) -> None:
        assert queue_time >= 0
        self._count("admit")

    def on_first_token(self, request_id, ttft) -> None:
        assert ttft > 0
        self._count("first_token")

    def on_token(self, request_id, inter_token_time) -> None:
        self._count("token")

    def on_finish(self, request_id, reason, usage, timings) -> None:
        self._count("finish")
        self.reasons.append(reason)

    def on_step(self, batch_size, num_tokens, prefill_tokens, seconds) -> None:
        self._count("step")
        raise RuntimeError("a broken observer must not break the engine")


def test_observer_hooks_and_stats(tiny_model, tokenizer, make_engine) -> None:
    observer = CountingObserver()
    engine = make_engine(tiny_model, tokenizer, observer=observer)
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    results = engine.generate_batch([(None, PROMPT, params)] * 3, timeout=WAIT)
    assert all(r.finish_reason is FinishReason.LENGTH for r in results)
    assert observer.calls == {"admit": 3, "first_token": 3, "token": 15, "finish": 3, "step": 5}
    stats = engine.stats()
    assert (stats.steps, stats.tokens_generated, stats.prompt_tokens_processed) == (5, 15, 30)
    assert stats.kv_slots_max == 32 and stats.kv_tokens_max == 32 * 512
    timings = results[0].timings
    assert timings.queued_at <= timings.admitted_at <= timings.first_token_at
    assert timings.first_token_at <= timings.finished_at
    assert timings.ttft == timings.first_token_at - timings.queued_at > 0


def test_shutdown_fails_pending_requests_and_refuses_new_ones(
    tiny_model, tokenizer, make_engine
) -> None:
    engine = make_engine(tiny_model, tokenizer, start=False)
    recorder = Recorder()
    engine.submit(PROMPT, SamplingParams(), on_event=recorder)
    engine.shutdown()
    final = recorder.wait()
    assert final.finish_reason is FinishReason.ERROR and "shut down" in final.error
    with pytest.raises(EngineStopped):
        engine.submit(PROMPT, on_event=Recorder())


def test_generate_batch_times_out_and_cancels(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer, start=False)
    with pytest.raises(TimeoutError):
        engine.generate_batch([(None, PROMPT, SamplingParams())], timeout=0.05)
    engine.start()
    result = generate_one(engine, PROMPT, SamplingParams(max_new_tokens=2))
    assert len(result.token_ids) == 2


def test_unsupported_architecture_is_named(tokenizer) -> None:
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    with pytest.raises(UnsupportedModel, match="LlamaForCausalLM"):
        Engine(model, tokenizer)


def test_engine_config_is_validated(tiny_model, tokenizer) -> None:
    with pytest.raises(ValueError, match="max_step_tokens"):
        Engine(tiny_model, tokenizer, EngineConfig(max_running=8, max_step_tokens=4))


def test_encode_helper_tokenises_a_plain_prompt(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer, start=False)
    assert engine.encode("Hello, world") == tokenizer.encode("Hello, world")
    assert engine.encode("Hello, world") == [19556, 28, 905]


def test_runner_takes_dtype_from_the_model(tokenizer, make_engine) -> None:
    """bfloat16 weights still give float32 logits for sampling; the cache is the model's
    dtype (the decode kernel sums in float32 whatever it reads)."""
    torch.manual_seed(0)
    config = LlamaConfig(**tiny_config(vocab_size=1024))
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    engine = make_engine(model, tokenizer)
    assert engine.cache.storage.dtype is torch.bfloat16
    assert engine.cache.storage.device == next(model.parameters()).device
    result = generate_one(engine, [5, 6, 7], SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert len(result.token_ids) == 3


def test_a_fault_outside_the_model_call_is_recovered(
    tiny_model, tokenizer, make_engine, monkeypatch
) -> None:
    engine = make_engine(tiny_model, tokenizer, start=False)
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    running = Recorder()
    engine.submit(PROMPT, params, on_event=running)
    schedule = engine.scheduler.schedule
    calls = []

    def broken_once(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("scheduler bug")
        return schedule(*args)

    monkeypatch.setattr(engine.scheduler, "schedule", broken_once)
    engine.start()
    final = running.wait()
    assert final.finish_reason is FinishReason.ERROR and "scheduler bug" in final.error
    assert (engine.stats().kv_slots_used, engine.stats().kv_tokens_used) == (0, 0)
    assert len(generate_one(engine, PROMPT, params).token_ids) == 5


class StepLog(EngineObserver):
    """Prompt tokens fed by each step, in order."""

    def __init__(self) -> None:
        self.prefill: list[int] = []

    def on_step(
        self, batch_size: int, num_tokens: int, prefill_tokens: int, seconds: float
    ) -> None:
        self.prefill.append(prefill_tokens)


def test_a_burst_of_prompts_is_prefilled_in_whole_steps(tokenizer, make_engine) -> None:
    """Eight prompts at once, 32 tokens a step: the three that got their first token do not
    hold the five still to feed to the pacer's 8 tokens a step (nothing measured yet), even
    once they outnumber them: those came with them (scheduler.py, `burst_pending`)."""
    log = StepLog()
    runner = ScriptedRunner([300, 301, 302], prompt_len=len(PROMPT))
    engine = make_engine(
        None, tokenizer, runner=runner, observer=log, max_running=8, max_step_tokens=32
    )
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    results = engine.generate_batch([(None, PROMPT, params)] * 8, WAIT)
    assert all(len(r.token_ids) == 6 for r in results)
    assert log.prefill[:4] == [32, 32 - 3, 8 * len(PROMPT) - 32 - 29, 0], log.prefill


def test_an_idle_engine_gives_its_kv_pages_back_after_a_while(tiny_model, tokenizer, make_engine):
    """On the CPU the written KV pages stay between requests (no page faults for the next
    ones) and go back once the engine has been idle `kv_release_after_s`."""
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    kept = make_engine(tiny_model, tokenizer)
    first = generate_one(kept, PROMPT, params).token_ids
    assert kept.cache.holds_pages and kept.cache.num_used == 0
    released = make_engine(tiny_model, tokenizer, kv_release_after_s=0.05)
    assert generate_one(released, PROMPT, params).token_ids == first
    deadline = time.monotonic() + WAIT
    while released.cache.holds_pages and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not released.cache.holds_pages
    # All but the pages of the finished request's rows, kept for a prompt that continues it.
    assert released.cache.kept == {0: PROMPT + first[:-1]}
    assert float(released.cache.storage[:, :, 1:].abs().sum()) == 0.0
    assert float(released.cache.storage[:, :, 0, :, 64:].abs().sum()) == 0.0
    assert generate_one(released, PROMPT, params).token_ids == first
    assert kept.cache.holds_pages
