"""Prefix reuse: a prompt starting with tokens a free slot's rows still hold skips them, and
its tokens are still the model's own greedy ones."""

from __future__ import annotations

import pytest
import torch

from inference.engine import FinishReason, SamplingParams
from inference.engine.kv_cache import KVCache, KVSpec
from inference.engine.model_runner import LlamaRunner
from tests.engine.helpers import WAIT, FlakyRunner, Recorder, generate_one, hf_greedy

SYSTEM = [1, 9125, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 2, 198, 1, 4093, 198]
QUESTIONS = ([1520, 314, 260, 3575, 282, 4649, 47, 2], [10813, 549, 23605, 30, 2])
NEW_TOKENS = 6


def cache_of(slots: int = 4, length: int = 32) -> KVCache:
    spec = KVSpec(2, 1, 2, torch.float32, torch.device("cpu"))
    return KVCache(spec, slots, length)


def occupy(cache: KVCache, tokens: list[int], value: float) -> int:
    slot = cache.allocate()
    cache.extend(slot, len(tokens))
    cache.storage[:, :, slot, :, : len(tokens)] = value
    return slot


def test_a_free_slot_s_rows_start_a_prompt_that_begins_with_its_tokens() -> None:
    cache = cache_of()
    first, second = [5, 6, 7, 8], [5, 6, 9, 9, 9]
    occupy(cache, first, 1.0)
    occupy(cache, second, 2.0)
    cache.free(1, second)
    cache.free(0, first)
    assert cache.kept == {0: first, 1: second}

    slot, held = cache.allocate_prefix([5, 6, 9, 9, 4, 4])
    assert (slot, held) == (0, 4), "slot 1 holds the longest start: copied into slot 0"
    assert torch.all(cache.storage[:, :, 0, :, :4] == 2.0)
    assert cache.kept == {1: second, 2: first}, "slot 0's rows saved to a slot keeping none"
    assert torch.all(cache.storage[:, :, 1, :, :5] == 2.0)
    assert torch.all(cache.storage[:, :, 2, :, :4] == 1.0)

    slot, held = cache.allocate_prefix(second)
    assert (slot, held) == (1, 4), "never the last token: its logits pick the next one"
    assert cache.allocate_prefix([7, 7]) == (2, 0)


def test_what_a_cache_forgets_its_slots_no_longer_offer() -> None:
    cache = cache_of()
    occupy(cache, [5, 6, 7], 1.0)
    occupy(cache, [5, 6, 8], 2.0)
    cache.free(0, [5, 6, 7])
    assert cache.kept == {1: [5, 6, 7]}, "the last slot's index is the one freed"
    cache.reset()
    assert cache.allocate_prefix([5, 6, 7, 9]) == (0, 0)


def test_a_shrinking_cache_keeps_the_free_rows_that_still_fit() -> None:
    """An accelerator's cache shrinks as it empties: kept rows move with it where they fit."""
    spec = KVSpec(2, 1, 2, torch.float32, torch.device("cpu"))
    cache = KVCache(spec, 8, 64, initial_capacity=4, initial_slots=1, fresh_pages=False)
    for value in range(1, 5):
        occupy(cache, [value] * 40, float(value))
    for slot in (3, 2, 1):
        cache.free(slot, [slot + 1] * 40)
    assert cache.allocated_slots == 2 and cache.capacity == 64
    assert cache.kept == {1: [2] * 40}
    assert torch.all(cache.storage[:, :, 1, :, :40] == 2.0)
    cache.free(0, [1] * 40)
    assert (cache.allocated_slots, cache.capacity) == (1, 4)
    assert cache.kept == {0: [1] * 4}
    assert cache.allocate_prefix([1] * 6) == (0, 4)


def test_an_idle_cache_gives_back_every_page_but_the_kept_rows() -> None:
    """`release_pages` keeps what free slots hold for a conversation's next turn; the rest
    reads as zeros again."""
    cache = cache_of(length=4096)
    kept, dropped = [5, 6, 7], [9] * 3000
    occupy(cache, kept, 1.0)
    occupy(cache, dropped, 2.0)
    cache.free(1)
    cache.free(0, kept)
    assert cache.release_pages()
    assert torch.all(cache.storage[:, :, 0, :, :3] == 1.0)
    assert float(cache.storage[:, :, 1].abs().sum()) == 0.0
    assert cache.allocate_prefix([5, 6, 7, 8]) == (0, 3)


@pytest.mark.parametrize("reuse", [True, False])
def test_prompts_sharing_a_start_skip_it_and_keep_their_greedy_tokens(
    tiny_model, tokenizer, make_engine, reuse
) -> None:
    engine = make_engine(tiny_model, tokenizer, max_running=4, prefix_reuse=reuse)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    first = SYSTEM + QUESTIONS[0]
    answer = generate_one(engine, first, params).token_ids
    assert answer == hf_greedy(tiny_model, first, NEW_TOKENS)

    other = SYSTEM + QUESTIONS[1]
    assert generate_one(engine, other, params).token_ids == hf_greedy(tiny_model, other, NEW_TOKENS)
    # A follow-up turn: the conversation so far (its last token never fed), then more.
    follow_up = first + answer + QUESTIONS[1]
    assert generate_one(engine, follow_up, params).token_ids == hf_greedy(
        tiny_model, follow_up, NEW_TOKENS
    )
    stats = engine.stats()
    reused = len(SYSTEM) + len(first) + NEW_TOKENS - 1 if reuse else 0
    assert stats.prompt_tokens_reused == reused
    assert stats.prompt_tokens_processed == len(first) + len(other) + len(follow_up) - reused


class WritesThenFails(FlakyRunner):
    """On its chosen calls the step writes its rows, spoils them (finite values: masked keys
    beyond a slot's length are still read, times zero) and then fails, as a fault part-way
    through a step can leave them."""

    def forward(self, batch, cache):
        self.calls += 1
        logits = self.inner.forward(batch, cache)
        if self.calls in self.fail_calls:
            for slot, length in enumerate(cache.lengths):
                cache.storage[:, :, slot, :, :length] = 7.0
            raise RuntimeError(f"injected fault in step {self.calls}")
        return logits


def test_a_failed_request_s_rows_are_not_offered_again(tiny_model, tokenizer, make_engine) -> None:
    runner = WritesThenFails(LlamaRunner(tiny_model), fail_calls={2})
    engine = make_engine(tiny_model, tokenizer, runner=runner, max_running=4)
    prompt = SYSTEM + QUESTIONS[0]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    failed = Recorder()
    engine.submit(prompt, params, on_event=failed)
    assert failed.wait().finish_reason is FinishReason.ERROR

    again = engine.generate_batch([(None, prompt, params)], timeout=WAIT)[0]
    assert again.token_ids == hf_greedy(tiny_model, prompt, NEW_TOKENS)
    assert engine.stats().prompt_tokens_reused == 0
