"""Unit tests of the engine's parts: stop matcher, detokeniser, KV cache, sampling."""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inference.engine import InvalidRequest, SamplingParams
from inference.engine.detokenizer import IncrementalDetokenizer, special_token_ids
from inference.engine.kv_cache import KVCache, KVSpec, zero_pages
from inference.engine.page_ahead import MARGIN, WINDOW
from inference.engine.sampling import NUCLEUS_CANDIDATES, RequestSampler, nucleus
from inference.engine.stop import StopMatcher

MIXED_TEXT = "안녕하세요 👋🏽 世界! Hello, wörld. 🇰🇷"


def feed(matcher: StopMatcher, pieces: list[str]) -> list[str]:
    return [matcher.push(piece) for piece in pieces]


def test_stop_matcher_holds_back_a_split_stop_and_drops_it() -> None:
    matcher = StopMatcher(["</answer>"])
    out = feed(matcher, ["The answer", " is 42", "</", "ans", "wer>", " never shown"])
    assert out == ["The answer", " is 42", "", "", "", ""]
    assert matcher.stopped
    assert matcher.flush() == ""


def test_stop_matcher_releases_a_partial_match_that_does_not_complete() -> None:
    matcher = StopMatcher(["</answer>"])
    out = feed(matcher, ["a </", "an", "d b"])
    assert out == ["a ", "", "</and b"]
    assert not matcher.stopped
    out.append(matcher.flush())
    assert "".join(out) == "a </and b"


def test_stop_matcher_flushes_a_held_tail_at_the_end() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("ends with ST") == "ends with "
    assert matcher.flush() == "ST"


def test_stop_matcher_cuts_at_the_earliest_of_several_stops() -> None:
    matcher = StopMatcher(["world", "lo w"])
    assert matcher.push("hello world") == "hel"
    assert matcher.stopped


def test_stop_matcher_stop_inside_one_piece() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.push("line one\n\nline two") == "line one"


def test_detokenizer_pieces_concatenate_to_decode_korean_and_emoji(tokenizer) -> None:
    ids = tokenizer.encode(MIXED_TEXT, add_special_tokens=False)
    assert len(ids) > len(MIXED_TEXT) // 2, "expected byte-level splits of multibyte chars"
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.step(token) for token in ids]
    pieces.append(detok.flush(ids))
    assert all("\ufffd" not in piece for piece in pieces)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True) == MIXED_TEXT
    assert pieces.count("") > 0, "some tokens complete no character and must yield nothing"


def test_detokenizer_skips_special_tokens_and_flushes_a_dangling_byte(tokenizer) -> None:
    body = tokenizer.encode("Hi 👋", add_special_tokens=False)
    ids = [tokenizer.convert_tokens_to_ids("<|im_start|>"), *body, 2, *body[:-1]]
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.step(token) for token in ids]
    assert all("\ufffd" not in piece for piece in pieces)
    tail = detok.flush(ids)
    assert "".join(pieces) + tail == tokenizer.decode(ids, skip_special_tokens=True)
    assert tail.endswith("\ufffd"), "a truncated last character decodes as U+FFFD, as decode does"
    assert {0, 1, 2, 3} <= special_token_ids(tokenizer)


def make_cache(
    max_slots: int = 8, max_seq_len: int = 64, initial: int = 4, fresh_pages: bool = True
) -> KVCache:
    spec = KVSpec(2, 1, 2, torch.float32, torch.device("cpu"))
    return KVCache(spec, max_slots, max_seq_len, initial, fresh_pages=fresh_pages)


def fill(cache: KVCache, slot: int, value: float) -> None:
    length = cache.lengths[slot]
    cache.storage[:, :, slot, :, :length] = value


def test_kv_cache_compacts_by_moving_the_last_slot_into_the_hole() -> None:
    cache = make_cache()
    for value, length in [(1.0, 3), (2.0, 5), (3.0, 2)]:
        slot = cache.allocate()
        cache.extend(slot, length)
        fill(cache, slot, value)
    assert cache.used_tokens == 10
    assert cache.free(0) == 2
    assert cache.lengths == [2, 5]
    assert torch.all(cache.storage[:, :, 0, :, :2] == 3.0)
    assert torch.all(cache.storage[:, :, 1, :, :5] == 2.0)
    assert cache.free(1) is None
    assert cache.free(0) is None
    assert (cache.num_used, cache.used_tokens) == (0, 0)


def test_kv_cache_grows_by_doubling_keeps_data_and_shrinks_back() -> None:
    """Zero-filled storage (an accelerator's): doubled as needed, halved back when empty."""
    cache = make_cache(max_slots=8, max_seq_len=64, initial=4, fresh_pages=False)
    slots = [cache.allocate() for _ in range(6)]
    assert cache.allocated_slots == 8
    for slot in slots:
        cache.extend(slot, 3)
        fill(cache, slot, float(slot + 1))
    cache.extend(0, 9)
    assert cache.capacity == 16
    for slot in slots:
        assert torch.all(cache.storage[:, :, slot, :, :3] == float(slot + 1))
    with pytest.raises(RuntimeError):
        cache.extend(0, 65)
    for _ in slots:
        cache.free(cache.num_used - 1)
    assert (cache.allocated_slots, cache.capacity, cache.used_tokens) == (4, 4, 0)
    assert cache.allocated_bytes == 2 * 2 * 4 * 1 * 4 * 2 * 4
    assert cache.max_tokens == 8 * 64


def test_kv_cache_on_the_cpu_keeps_its_storage_and_pages_until_released() -> None:
    """A long sequence leaving the CPU cache moves no other row, and the last leaving gives
    nothing back: the next requests write into pages already in. `release_pages` (an idle
    engine's) gives the written pages back; they read as zeros again."""
    cache = make_cache(max_slots=4, max_seq_len=64, initial=4)
    slots = [cache.allocate() for _ in range(3)]
    for slot in slots:
        cache.extend(slot, 2)
        fill(cache, slot, float(slot + 1))
    cache.reserve(60)
    cache.extend(slots[-1], 60)
    storage = cache.storage
    cache.free(slots[-1])
    assert cache.storage is storage and cache.capacity == 64
    assert torch.all(cache.storage[:, :, 1, :, :2] == 2.0)
    assert not cache.release_pages(), "two sequences still hold slots"
    cache.free(1)
    cache.free(0)
    assert cache.storage is storage and cache.holds_pages
    assert torch.all(cache.storage[:, :, 0, :, :2] == 1.0)
    assert cache.release_pages()
    assert not cache.holds_pages and not cache.release_pages()
    assert float(cache.storage.abs().sum()) == 0.0
    slot = cache.allocate()
    cache.extend(slot, 3)
    fill(cache, slot, 5.0)
    assert cache.holds_pages and torch.all(cache.storage[:, :, 0, :, :3] == 5.0)


def test_kv_cache_grows_once_to_a_long_prompt_s_reserved_length() -> None:
    cache = make_cache(max_slots=4, max_seq_len=64, initial=4)
    slots = [cache.allocate() for _ in range(3)]
    for slot in slots:
        cache.extend(slot, 3)
        fill(cache, slot, float(slot + 1))
    cache.reserve(40)  # a 40-token prompt admitted: 64 positions at once, not 8, 16, 32, 64
    assert cache.capacity == 64
    for slot in slots:
        assert torch.all(cache.storage[:, :, slot, :, :3] == float(slot + 1))
    assert torch.all(cache.storage[:, :, :, :, 3:] == 0.0)
    storage = cache.storage
    cache.extend(0, 40)
    assert cache.storage is storage


def test_kv_cache_storage_is_zero_without_being_filled() -> None:
    """Fresh pages: zeros where nothing was written, and no fill pass over the tensor."""
    cache = make_cache(max_slots=4, max_seq_len=64, initial=4)
    slot = cache.allocate()
    cache.extend(slot, 3)
    fill(cache, slot, 2.0)
    cache.reserve(64)
    assert torch.all(cache.storage[:, :, slot, :, :3] == 2.0)
    assert torch.all(cache.storage[:, :, slot, :, 3:] == 0.0)
    assert torch.all(cache.storage[:, :, 1:] == 0.0)
    before = _resident_mib()
    _, pages = zero_pages((1024, 1024, 512), torch.bfloat16)  # 1 GiB
    pages[5, 5] = 1.0
    assert pages.shape == (1024, 1024, 512) and pages.dtype == torch.bfloat16
    assert float(pages[1023].abs().sum()) == 0.0
    assert _resident_mib() - before < 64  # one page written, one row read: not 1 GiB filled


def test_kv_pages_are_faulted_in_ahead_of_the_writes_one_slot_a_step() -> None:
    """Each step tops up the slot nearest its populated end: its next WINDOW positions
    become resident (every layer, K and V, head) and what it holds is unchanged."""
    spec = KVSpec(30, 3, 64, torch.bfloat16, torch.device("cpu"))
    cache = KVCache(spec, 2, 2048, 2048)
    for value in (1.0, 2.0):
        slot = cache.allocate()
        cache.extend(slot, 10)
        cache.storage[:, :, slot, :, :10] = value
    if not cache.pages.enabled:
        pytest.skip("madvise(MADV_POPULATE_WRITE) is refused here")
    before = _resident_mib()
    cache.fault_ahead()
    grown = _resident_mib() - before
    rows = 30 * 2 * 3  # one slot's rows
    assert cache.pages.populated[:2] == [10 + WINDOW, 0]
    assert grown >= 0.9 * rows * WINDOW * 64 * 2 / 2**20  # ~2.8 MiB of pages now in
    cache.fault_ahead()
    assert cache.pages.populated[:2] == [10 + WINDOW, 10 + WINDOW]
    cache.extend(0, 10 + WINDOW - MARGIN)
    cache.fault_ahead()
    assert cache.pages.populated[0] == 10 + WINDOW  # still MARGIN ahead: nothing to do
    cache.extend(0, 11 + WINDOW - MARGIN)
    cache.fault_ahead()
    assert cache.pages.populated[0] == 11 + 2 * WINDOW - MARGIN
    assert torch.all(cache.storage[:, :, 0, :, :10] == 1.0)
    assert torch.all(cache.storage[:, :, 1, :, :10] == 2.0)
    assert torch.all(cache.storage[:, :, :, :, 11 + WINDOW - MARGIN :] == 0.0)


def _resident_mib() -> float:
    """This process's resident memory (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_kv_cache_refuses_more_slots_than_configured() -> None:
    cache = make_cache(max_slots=2)
    cache.allocate()
    cache.allocate()
    with pytest.raises(RuntimeError):
        cache.allocate()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=0),
        SamplingParams(temperature=-1.0),
        SamplingParams(top_k=-1),
        SamplingParams(top_p=0.0),
        SamplingParams(repetition_penalty=0.0),
        SamplingParams(stop=("",)),
        SamplingParams(stop="oops"),
        SamplingParams(truncate_prompt_tokens=0),
    ],
)
def test_sampling_params_validation(params: SamplingParams) -> None:
    with pytest.raises(InvalidRequest):
        params.validate()


def test_sampler_filters_match_hf_logits_processors() -> None:
    torch.manual_seed(1)
    vocab = 500
    prompt = [3, 7, 7, 42]
    logits = torch.randn(vocab) * 3
    params = SamplingParams(
        do_sample=True, temperature=0.7, top_k=50, top_p=0.8, repetition_penalty=1.3
    )
    ours = RequestSampler(params, prompt, vocab, torch.device("cpu")).process(logits.clone())
    ids = torch.tensor([prompt])
    expected = logits.clone()[None]
    for processor in (
        RepetitionPenaltyLogitsProcessor(1.3),
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(50),
        TopPLogitsWarper(0.8),
    ):
        expected = processor(ids, expected)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected[0]))
    kept = ~torch.isinf(ours)
    assert 0 < int(kept.sum()) <= 50
    torch.testing.assert_close(ours[kept], expected[0][kept])


@pytest.mark.parametrize("spread", [8.0, 0.01], ids=["peaked: top-k path", "flat: full sort"])
def test_nucleus_matches_hf_top_p_on_a_full_vocabulary(spread: float) -> None:
    logits = torch.randn(49_152, generator=torch.Generator().manual_seed(3)) * spread
    expected = TopPLogitsWarper(0.9)(torch.tensor([[1]]), logits.clone()[None])[0]
    ours = nucleus(logits.clone(), 0.9)
    kept = ~torch.isinf(ours)
    assert torch.equal(kept, ~torch.isinf(expected))
    assert torch.equal(ours[kept], logits[kept])
    # the peaked row's nucleus lies within the candidates `sample_rows` looks in; the flat
    # one's does not, so a draw from it goes through this sort
    assert (int(kept.sum()) <= NUCLEUS_CANDIDATES[-1]) == (spread > 1)


def test_sampled_tokens_follow_the_distribution() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -math.inf, 0.5])
    params = SamplingParams(do_sample=True, temperature=1.0, seed=11)
    sampler = RequestSampler(params, [0], 6, torch.device("cpu"))
    counts = torch.bincount(torch.tensor([sampler.sample(logits) for _ in range(20_000)]), None, 6)
    share = counts / counts.sum()
    assert counts[4] == 0  # a masked token is never drawn
    torch.testing.assert_close(share, logits.softmax(-1), atol=0.015, rtol=0)


def test_seeded_sampler_is_reproducible_and_seed_sensitive() -> None:
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))

    def draws(seed: int) -> list[int]:
        params = SamplingParams(do_sample=True, temperature=1.5, seed=seed)
        sampler = RequestSampler(params, [1], 1000, torch.device("cpu"))
        return [sampler.sample(logits) for _ in range(20)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_eos_ids_merge_generation_config_int_or_list_with_tokenizer(tokenizer) -> None:
    from types import SimpleNamespace

    from inference.engine import eos_token_ids

    as_list = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[5, 7]))
    as_int = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=9))
    assert eos_token_ids(as_list, tokenizer) == {2, 5, 7}
    assert eos_token_ids(as_int, tokenizer) == {2, 9}
    assert eos_token_ids(None, tokenizer) == {2}


HEAP_PROBE = """
import ctypes
from inference.engine.heap import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)

def mapped_blocks(size):
    before = libc.mallinfo2().hblks
    block = libc.malloc(size)
    count = libc.mallinfo2().hblks - before
    libc.free(block)
    return count

print(mapped_blocks(24 << 20), keep_freed_memory(), mapped_blocks(24 << 20))
"""


def test_malloc_keeps_a_step_sized_block_in_the_heap() -> None:
    """glibc maps a fresh 24 MB block (and unmaps it when freed) until the engine fixes the
    thresholds; then it comes from the heap and stays for the next step (heap.py)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("not glibc 2.33 or later")
    out = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["1", "True", "0"], out
