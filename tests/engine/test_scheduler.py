"""The scheduler's plan: decoders first, then prompt chunks shortest remaining first."""

from __future__ import annotations

import torch

from inference.engine.kv_cache import KVCache, KVSpec
from inference.engine.sampling import SamplingParams
from inference.engine.scheduler import BURST_WINDOW, MIN_CHUNK, Scheduler
from inference.engine.sequence import Sequence, Status

SPEC = KVSpec(
    num_layers=1, num_kv_heads=1, head_dim=4, dtype=torch.float32, device=torch.device("cpu")
)


def sequence(name: str, prompt_tokens: int) -> Sequence:
    """A request with a prompt of `prompt_tokens` tokens (no sampler: nothing is sampled)."""
    return Sequence(name, [1] * prompt_tokens, SamplingParams(), 8, None, None, lambda e: None)


def scheduler(max_running: int = 4) -> Scheduler:
    return Scheduler(KVCache(SPEC, max_running, 4096, 16), max_running, 16, 512)


def decoding(sched: Scheduler) -> Sequence:
    """A request admitted, its 4-token prompt fed, and its first token out: it decodes next."""
    first = sequence("first", 4)
    sched.add([first])
    sched.schedule(8)
    first.output_ids.append(5)
    return first


def chunks(plan) -> dict[str, int]:
    """Prompt tokens each request feeds in a planned step, by request id."""
    by_slot = {seq.slot: seq.request_id for seq in plan.sequences}
    return {by_slot[chunk.slot]: len(chunk.token_ids) for chunk in plan.chunks}


def test_a_short_prompt_is_not_queued_behind_a_long_prefill() -> None:
    sched = scheduler()
    long = sequence("long", 2000)
    sched.add([long])
    assert chunks(sched.schedule(33)) == {"long": 33}
    short = sequence("short", 37)
    sched.add([short])
    plan = sched.schedule(40)
    assert chunks(plan) == {"short": 37, "long": 3}
    assert plan.admitted == [short] and short.status is Status.RUNNING
    assert not short.prefilling and long.num_computed == 36


def test_decoders_feed_first_and_the_budget_bounds_prompt_tokens() -> None:
    sched = scheduler()
    first = decoding(sched)
    sched.add([sequence("a", 30), sequence("b", 10)])
    plan = sched.schedule(12)
    assert plan.decode_slots == [first.slot]
    assert chunks(plan) == {"b": 10, "a": 2}


def test_waiting_requests_beyond_the_free_slots_stay_queued_in_order() -> None:
    sched = scheduler(max_running=2)
    sched.add([sequence("a", 50), sequence("b", 40), sequence("c", 5)])
    plan = sched.schedule(512)
    # Two free slots: the first two arrivals compete; the short third waits its turn.
    assert chunks(plan) == {"b": 40, "a": 50}
    assert [s.request_id for s in sched.waiting] == ["c"]


def test_a_prompt_alone_goes_whole_and_never_twice_in_a_row() -> None:
    sched = scheduler()
    decoding(sched)
    sched.add([sequence("long", 100), sequence("a", 30), sequence("b", 20)])
    plan = sched.schedule_alone(64)
    assert plan.decode_slots == [] and chunks(plan) == {"b": 20, "a": 30}
    for seq in plan.samplers:
        seq.output_ids.append(5)  # their first tokens
    assert sched.schedule_alone(64) is None  # the decoders' turn
    assert sched.schedule(512).decode_slots  # ... which schedule gives them
    assert sched.schedule_alone(64) is None  # the long prompt does not fit alone


def test_chunks_are_cut_to_the_keys_they_may_attend_but_the_first_always_advances() -> None:
    sched = scheduler()
    long = sequence("long", 2000)
    sched.add([long])
    sched.schedule(512)  # 512 tokens in
    assert chunks(sched.schedule(33, 33 * 600)) == {"long": 33}  # 33 x 545 fits
    long.num_computed = 1900
    assert chunks(sched.schedule(33, 20 * 1920)) == {"long": 20}
    assert chunks(sched.schedule(33, 0)) == {"long": MIN_CHUNK}  # whatever it attends
    short = sequence("short", 30)
    sched.add([short])
    # The short prompt goes first and attends 900 keys; the long one gets what is left.
    assert chunks(sched.schedule(64, 900 + 10 * 1938)) == {"short": 30, "long": 10}


def test_starting_counts_prompts_still_to_feed_that_slots_can_take() -> None:
    """Prefilling ones, and waiting ones up to the free slots: not those that must queue."""
    sched = scheduler(max_running=4)
    first = decoding(sched)
    sched.add([sequence("long", 2000)])
    sched.schedule(33)
    assert sched.decoders() == 1 and sched.starting() == 1
    sched.add([sequence(name, 10) for name in "abcd"])
    assert sched.starting() == 1 + 2  # two free slots of four
    assert first.status is Status.RUNNING


def test_a_burst_is_pending_while_a_request_that_came_with_the_decoders_starts() -> None:
    """Requests within BURST_WINDOW of the latest decoder's arrival are its companions; one
    that came later is not (pacing protects the decoders from it)."""
    sched = scheduler(max_running=3)
    first = decoding(sched)
    assert not sched.burst_pending(), "nobody is starting"
    companion, later = sequence("companion", 40), sequence("later", 40)
    companion.queued_at = first.queued_at + BURST_WINDOW / 2
    later.queued_at = first.queued_at + 2 * BURST_WINDOW
    sched.add([companion, later])
    assert sched.burst_pending(), "a waiting companion with a free slot"
    sched.schedule(8)  # shortest first is a tie: arrival order admits the companion
    assert companion.prefilling and later.status is Status.WAITING
    assert sched.burst_pending()
    sched.schedule(32)
    companion.output_ids.append(5)
    assert not companion.prefilling and later.status is Status.WAITING
    assert not sched.burst_pending(), "the companion decodes; only the later one starts"


def test_the_next_start_is_where_the_first_chunk_fed_next_begins() -> None:
    """The pacer plans the step's keys for that chunk: the shortest prompt left, fed first."""
    sched = scheduler()
    assert sched.next_start() is None
    long = sequence("long", 2000)
    sched.add([long])
    sched.schedule(33)
    assert sched.next_start() == 33
    sched.add([sequence("short", 37)])
    assert sched.next_start() == 0  # a newcomer, fed before the long prompt's rest
    sched.schedule(40)
    assert sched.next_start() == 36  # the short one went whole, the long one took 3 more
