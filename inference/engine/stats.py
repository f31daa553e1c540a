"""The engine's counters and KV use, kept by the loop and read as one immutable snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine.kv_cache import KVCache
    from inference.engine.scheduler import Scheduler


@dataclass(frozen=True)
class EngineStats:
    """A cheap snapshot for /health, the ops page and metrics gauges."""

    running: int
    waiting: int
    kv_tokens_used: int
    kv_tokens_capacity: int
    kv_tokens_max: int
    kv_bytes_allocated: int
    kv_slots_used: int
    kv_slots_max: int
    steps: int
    steps_interrupted: int
    tokens_generated: int
    prompt_tokens_processed: int
    prompt_tokens_reused: int
    requests_finished: int


@dataclass
class Counters:
    """The loop's running totals; only the engine thread writes them."""

    steps: int = 0
    steps_interrupted: int = 0
    tokens_generated: int = 0
    prompt_tokens_processed: int = 0
    requests_finished: int = 0


def snapshot(scheduler: Scheduler, cache: KVCache, counters: Counters) -> EngineStats:
    """Counters and KV use, read without stopping the loop (so possibly one step stale)."""
    lengths = list(cache.lengths)
    return EngineStats(
        running=len(scheduler.running),
        waiting=len(scheduler.waiting),
        kv_tokens_used=sum(lengths),
        kv_tokens_capacity=cache.capacity_tokens,
        kv_tokens_max=cache.max_tokens,
        kv_bytes_allocated=cache.allocated_bytes,
        kv_slots_used=len(lengths),
        kv_slots_max=cache.max_slots,
        steps=counters.steps,
        steps_interrupted=counters.steps_interrupted,
        tokens_generated=counters.tokens_generated,
        prompt_tokens_processed=counters.prompt_tokens_processed,
        prompt_tokens_reused=scheduler.prompt_tokens_reused,
        requests_finished=counters.requests_finished,
    )
