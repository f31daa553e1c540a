"""The engine on the real SmolLM2-135M-Instruct (float32): parity with HF and batch invariance."""

from __future__ import annotations

import pytest

from inference.engine import FinishReason, SamplingParams
from tests.engine.helpers import WAIT, Recorder, generate_one, hf_greedy

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child.",
    "List three uses of a paperclip.",
    "안녕하세요! 한국어로 자기소개를 해 주세요.",
]


def chat_prompt(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def test_greedy_matches_hf_generate_token_for_token(smollm, make_engine) -> None:
    engine = make_engine(smollm.model, smollm.tokenizer)
    prompts = [chat_prompt(smollm.tokenizer, q) for q in QUESTIONS[:2]]
    results = engine.generate_batch(
        [(None, p, SamplingParams(max_new_tokens=24)) for p in prompts], timeout=WAIT
    )
    for prompt, result in zip(prompts, results, strict=True):
        expected = hf_greedy(smollm.model, prompt, 24)
        assert result.token_ids == expected
        assert result.text == smollm.tokenizer.decode(expected, skip_special_tokens=True)
    assert results[0].finish_reason is FinishReason.EOS_TOKEN, "'Paris.' then <|im_end|>"


def test_real_model_batch_invariance_and_streamed_text(smollm, make_engine) -> None:
    """Five chats joining at different steps stream exactly what each produces alone."""
    tokenizer = smollm.tokenizer
    engine = make_engine(smollm.model, tokenizer, max_step_tokens=48)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    prompts = [chat_prompt(tokenizer, q) for q in QUESTIONS]
    alone = [generate_one(engine, p, params).token_ids for p in prompts]
    recorders = [Recorder() for _ in prompts]

    def chain(index: int):
        def on_event(event) -> None:
            recorders[index](event)
            if event.index == 1 and event.token_id is not None and index + 1 < len(prompts):
                engine.submit(prompts[index + 1], params, on_event=chain(index + 1))

        return on_event

    engine.submit(prompts[0], params, on_event=chain(0))
    for recorder in recorders:
        recorder.wait()
    assert [r.token_ids for r in recorders] == alone
    for recorder, tokens in zip(recorders, alone, strict=True):
        assert all("\ufffd" not in e.text for e in recorder.events)
        assert recorder.text == tokenizer.decode(tokens, skip_special_tokens=True)
    assert engine.stats().kv_tokens_used == 0
