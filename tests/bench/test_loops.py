"""The lecture's loops on a tiny random model: exactly what each one feeds the model."""

from __future__ import annotations

from bench.peers import kv_loop, naive

PROMPT = "The quick brown fox jumps over"


def test_naive_loop_refeeds_the_retokenised_string_every_step(tiny_model, tokenizer) -> None:
    new_tokens = 5
    expected = sum(
        len(
            tokenizer.encode(
                PROMPT + naive.run(tiny_model, tokenizer, [PROMPT], k).texts[0],
                add_special_tokens=False,
            )
        )
        if k
        else len(tokenizer.encode(PROMPT, add_special_tokens=False))
        for k in range(new_tokens)
    )
    run = naive.run(tiny_model, tokenizer, [PROMPT], new_tokens)
    assert run.tokens_fed == expected
    assert [len(t.stamps) for t in run.traces] == [new_tokens]


def test_kv_loop_feeds_the_prompt_once_then_one_token_per_step(tiny_model, tokenizer) -> None:
    prompt_len = len(tokenizer.encode(PROMPT, add_special_tokens=False))
    run = kv_loop.run(tiny_model, tokenizer, [PROMPT], 20)
    assert run.tokens_fed == kv_loop.fed_with_cache(prompt_len, 20) == prompt_len + 19
    assert naive.fed_without_cache(prompt_len, 20) == 20 * prompt_len + 190
