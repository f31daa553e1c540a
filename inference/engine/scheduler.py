"""Continuous-batching scheduler: who runs in the next step and how many tokens each feeds.

Policy, per step, under a token budget (`max_step_tokens`):
0. a waiting prompt short enough for the pacer's `alone_tokens` goes in whole, in a
   prefill-only step before the decoders' next one (never two such steps in a row; one
   arriving during the decoders' step may run inside it: `Engine._cut_in`);
1. every running sequence that is decoding feeds its one token;
2. the prompt budget goes to prompt chunks, shortest remaining prompt first, among the
   sequences still prefilling (long prompts admitted earlier) and the waiting requests that
   free slots (`max_running`) can take, those looked at in arrival order; a waiting request
   is admitted when it gets a chunk. Chunks also stay within the pacer's attended keys
   (chunk size x end position, summed), the step's first chunk getting MIN_CHUNK tokens
   whatever it attends.
A long prompt is therefore spread over several steps while the decoders keep producing, and
a short prompt arriving meanwhile is not queued behind it: it goes in whole, next step.
Oldest first, a 40-token question arriving while a 2,000-token prompt prefilled waited for
all of it (~60 steps).

Pacing protects decoders from prompts that came after them, not from their own companions:
while a request that arrived with the decoders (within BURST_WINDOW of the latest of them)
still waits for its first token, the engine plans unpaced steps (`burst_pending`). Paced, a
32-prompt burst's last five prompts went in over five small steps (one alone, or 33-36
tokens beside the first 27 decoders), ~260 ms, and trailed the rest to the end; unpaced,
they take one step beside the decoders.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque

from inference.engine.batch import PrefillChunk, StepBatch
from inference.engine.errors import Overloaded
from inference.engine.kv_cache import KVCache
from inference.engine.pacing import chunk_fitting
from inference.engine.sequence import Sequence, Status

RETRY_AFTER_BOUNDS = (1.0, 60.0)
MIN_CHUNK = 8  # prompt tokens a step gives its first chunk whatever it attends
# Seconds within which requests count as one burst: submitted together, or as separate HTTP
# requests a client sent at once.
BURST_WINDOW = 0.1


class Scheduler:
    """Waiting queue, running set and slot ownership.

    `waiting` is shared with submitting threads: callers hold the engine's lock around
    `add`, `remove_waiting` and `schedule`. Everything else runs on the engine thread.
    """

    def __init__(
        self,
        cache: KVCache,
        max_running: int,
        max_waiting: int,
        max_step_tokens: int,
        reuse_prefixes: bool = True,
    ) -> None:
        self.cache = cache
        self.reuse_prefixes = reuse_prefixes
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.max_step_tokens = max_step_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_slot: list[Sequence] = []
        self._mean_duration = 1.0
        self._alone_last = False
        self.prompt_tokens_reused = 0

    def has_work(self) -> bool:
        """Whether a step would do anything."""
        return bool(self.waiting or self.running)

    def add(self, sequences: list[Sequence]) -> None:
        """Queue requests, all or none; Overloaded when the waiting queue lacks room."""
        if len(self.waiting) + len(sequences) > self.max_waiting:
            raise Overloaded(len(self.waiting), self.retry_after())
        self.waiting.extend(sequences)

    def retry_after(self) -> float:
        """Seconds until the queue has likely drained: waiting / slots x mean request time."""
        estimate = len(self.waiting) / self.max_running * self._mean_duration
        low, high = RETRY_AFTER_BOUNDS
        return float(min(high, max(low, math.ceil(estimate))))

    def remove_waiting(self, seq: Sequence) -> bool:
        """Drop a request that was never admitted."""
        try:
            self.waiting.remove(seq)
        except ValueError:
            return False
        return True

    def decoders(self) -> int:
        """Running sequences past their prompt: each feeds one token next step."""
        return sum(1 for s in self.running if not s.prefilling)

    def starting(self) -> int:
        """Requests the next step could feed prompt tokens: those still prefilling, and the
        waiting ones the free slots can take (callers hold the engine's lock)."""
        return sum(1 for s in self.running if s.prefilling) + len(self._newcomers())

    def burst_pending(self) -> bool:
        """Whether a request still waiting for its first token arrived with the decoders
        (at most BURST_WINDOW after the latest of them); callers hold the engine's lock."""
        arrivals = [s.queued_at for s in self.running if not s.prefilling]
        if not arrivals:
            return False
        latest = max(arrivals) + BURST_WINDOW
        starting = [s for s in self.running if s.prefilling] + self._newcomers()
        return any(s.queued_at <= latest for s in starting)

    def schedule(
        self, prefill_budget: int | None = None, prefill_keys: int | None = None
    ) -> StepBatch | None:
        """Plan the next step (admitting waiting requests); None when there is nothing to run.

        Decoders first, then at most `prefill_budget` prompt tokens (the pacer's), all
        within `max_step_tokens`, shortest remaining prompt first; chunks attend at most
        `prefill_keys` keys in all (size x end each), though the step's first chunk gets
        MIN_CHUNK tokens whatever it attends, so a long prompt always advances. Cache lengths and
        `num_computed` are advanced here, as if the step succeeds; a step that fails frees
        every sequence in it, so nothing is left half-committed.
        """
        batch = StepBatch()
        budget = self.max_step_tokens
        for seq in sorted((s for s in self.running if not s.prefilling), key=lambda s: s.slot):
            position = seq.total_len - 1
            self.cache.extend(seq.slot, position + 1)
            seq.num_computed = position + 1
            batch.decode_slots.append(seq.slot)
            batch.decode_token_ids.append(seq.output_ids[-1])
            batch.decode_positions.append(position)
            batch.sequences.append(seq)
            batch.samplers.append(seq)
            budget -= 1
        if prefill_budget is not None:
            budget = min(budget, prefill_budget)
        prefilling = [s for s in self.running if s.prefilling]
        for seq in sorted(prefilling + self._newcomers(), key=_remaining_prompt):
            if budget <= 0:
                break
            size = min(budget, chunk_fitting(seq.num_computed, prefill_keys))
            if not batch.chunks:
                size = max(size, min(budget, MIN_CHUNK))
            if size <= 0:
                continue
            if seq.status is Status.WAITING:
                self._admit(seq, batch)
            planned = self._plan_chunk(seq, size, batch)
            budget -= planned
            if prefill_keys is not None:
                prefill_keys -= planned * seq.num_computed
        self.cache.fault_ahead()
        return batch if batch.sequences else None

    @property
    def after_alone(self) -> bool:
        """Whether the last step planned was a prefill-only one (`schedule_alone`)."""
        return self._alone_last

    def schedule_alone(self, max_tokens: int) -> StepBatch | None:
        """A prefill-only step of whole waiting prompts (shortest first, at most `max_tokens`
        together) to run before the decoders' next step; None when none fits, or when the
        previous step was one (decoders wait at most one such step).
        """
        if self._alone_last or max_tokens <= 0:
            self._alone_last = False
            return None
        newcomers = sorted(self._newcomers(), key=_remaining_prompt)
        batch = StepBatch()
        for seq in newcomers:
            if len(seq.prompt_ids) > max_tokens:
                break
            self._admit(seq, batch)
            max_tokens -= self._plan_chunk(seq, max_tokens, batch)
        self._alone_last = bool(batch.sequences)
        return batch if batch.sequences else None

    def next_start(self) -> int | None:
        """Where the next step's first prompt chunk starts (the order `schedule` feeds them
        in); None when no prompt is left to feed."""
        prompts = [s for s in self.running if s.prefilling] + self._newcomers()
        return min(prompts, key=_remaining_prompt).num_computed if prompts else None

    def _newcomers(self) -> list[Sequence]:
        """The waiting requests the free slots could take, in arrival order."""
        free = self.max_running - len(self.running)
        return list(itertools.islice(self.waiting, max(free, 0)))

    def _admit(self, seq: Sequence, batch: StepBatch) -> None:
        """Give a waiting request a slot and make it running; the start of its prompt that a
        free slot's rows still hold counts as computed (`KVCache.allocate_prefix`)."""
        self.waiting.remove(seq)
        seq.slot, held = self.cache.allocate_prefix(seq.prompt_ids)
        seq.num_computed = held
        self.prompt_tokens_reused += held
        seq.status = Status.RUNNING
        seq.admitted_at = time.monotonic()
        self._by_slot.append(seq)
        self.running.append(seq)
        batch.admitted.append(seq)

    def _plan_chunk(self, seq: Sequence, budget: int, batch: StepBatch) -> int:
        """Add the next prompt chunk of `seq` (at most `budget` tokens); return its size."""
        start = seq.num_computed
        end = min(len(seq.prompt_ids), start + budget)
        self.cache.reserve(len(seq.prompt_ids))  # the whole prompt's rows, one growth
        self.cache.extend(seq.slot, end)
        seq.num_computed = end
        needs_logits = end == len(seq.prompt_ids)
        batch.chunks.append(PrefillChunk(seq.slot, start, seq.prompt_ids[start:end], needs_logits))
        batch.sequences.append(seq)
        if needs_logits:
            batch.samplers.append(seq)
        return end - start

    def release(self, seq: Sequence, keep: bool = True) -> None:
        """Free a running sequence's slot and KV at once, re-pointing the moved sequence.

        The slot that becomes free holds the rows of `seq`, or of the sequence moved out of
        it: the cache keeps their tokens for later prompts (`reuse_prefixes`), unless `seq`
        failed (`keep` False: its step may have written part of its rows).
        """
        if seq.slot < 0:
            return
        holder = self._by_slot[-1]  # whose rows the last slot holds: seq's, or the moved one's
        kept = holder.cached_ids() if keep and self.reuse_prefixes else None
        moved_from = self.cache.free(seq.slot, kept)
        if moved_from is not None:
            moved = self._by_slot[moved_from]
            moved.slot = seq.slot
            self._by_slot[seq.slot] = moved
        self._by_slot.pop()
        self.running.remove(seq)
        seq.slot = -1

    def reset(self) -> list[Sequence]:
        """Drop every running sequence and empty the cache; return the dropped sequences."""
        dropped = self.running
        self.running, self._by_slot = [], []
        self.cache.reset()
        for seq in dropped:
            seq.slot = -1
        return dropped

    def record_duration(self, seconds: float) -> None:
        """Feed a finished request's duration into the retry-after estimate (EMA)."""
        self._mean_duration += 0.1 * (seconds - self._mean_duration)


def _remaining_prompt(seq: Sequence) -> int:
    """Prompt tokens not yet fed: the prefill order's key (shortest first)."""
    return len(seq.prompt_ids) - seq.num_computed
