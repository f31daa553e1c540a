"""How many prompt tokens a step may feed while others decode (Sarathi-style chunked prefill).

A step that feeds a 512-token prompt chunk next to 31 decoders makes all 31 wait for it:
their next token comes ten times later than usual. The pacer keeps a step with prefill
within `multiple` times a decode step's cost, from measured step times.

A step's cost follows its row count in steps, not in a line: the compiled graphs run padded
to a bucket (1, 2, 4 … 32, 48, 64 … 512 rows). So the pacer keeps the time of a step per row
bucket (the compiled graphs' own once they seed it, powers of two before), learned from
every step (decode-only or mixed) and seeded from the compiled graphs' warm-up timings, and
lets prefill fill the rows up to the largest bucket whose time stays within `multiple` times the
reference decode step: that of a full engine (`reference_rows`, the engine's max_running)
when it is known, else the decoders' own bucket. Against the decoders' own step alone, one
decoder (a 1-row step) held waiting prompts to a few tokens a step while it decoded: eight
short prompts arriving together took 3× HF's time to first token. A full engine's step is
the inter-token latency every decoder already accepts at full load.

An unmeasured bucket is estimated from its neighbours: by the next larger measured one (an
upper bound), else by scaling the largest smaller one with the rows (pessimistic); when not
even the decoders' bucket or one next to it is known, prefill gets `min_tokens` and the step
measures it. With no one decoding there is no one to stall, so prefill gets the whole step
budget; so it does while at least as many requests wait for their first token as decode
(`starting`, a burst): pacing would hold more of them back than it spares, and cut the
prompts into the small mixed steps that prefill least per second. A 32-request burst (37-token
prompts, 32 new tokens, compiled int8 step, 2-core Xeon with AMX) took 2.62-2.73 s paced,
its last prompts still prefilling 16 tokens a step while the first 15 decoded, and 2.20-2.23 s
so (TTFT p50 460 ms against 409-470). The long prompt's time to first token is the price
of pacing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

SMOOTHING = 0.2
# Steps with decoders the per-key cost is fitted over (the latest; a long prompt's chunks).
KEY_WINDOW = 32


def chunk_fitting(start: int, keys: int | None) -> int:
    """The largest chunk n from `start` with n x (start + n) <= keys (no limit: None)."""
    if keys is None:
        return 1 << 30
    if keys <= 0:
        return 0
    n = int((math.isqrt(start * start + 4 * keys) - start) // 2)
    while n * (start + n) > keys:
        n -= 1
    return n


def _bucket(rows: int) -> int:
    """The power of two at or above `rows`: the unit step times are kept in."""
    return 1 << max(rows - 1, 0).bit_length()


@dataclass
class PrefillPacer:
    """Prefill token budget per step, from measured step times by row bucket."""

    max_tokens: int
    multiple: float | None = 1.4
    min_tokens: int = 8
    reference_rows: int = 1
    seconds: dict[int, float] = field(default_factory=dict)
    alone: dict[int, float] = field(default_factory=dict)
    key_seconds: float | None = None
    key_floor: float = 0.0
    padded: bool = False
    buckets: tuple[int, ...] = ()
    recent: deque[tuple[int, int, float]] = field(default_factory=lambda: deque(maxlen=KEY_WINDOW))

    def paced(self, decoders: int, starting: int = 0) -> bool:
        """Whether a step beside `decoders` decoding sequences, with `starting` requests
        waiting for their first token (prefilling, or waiting for a free slot), is paced."""
        return self.multiple is not None and decoders > starting

    def budget(self, decoders: int, starting: int = 0) -> int:
        """Prompt tokens the next step may feed next to `decoders` decoding sequences."""
        if not self.paced(decoders, starting):
            return self.max_tokens
        reference = self.decoders_cost(self.bucket(max(decoders, self.reference_rows)))
        base = reference if reference is not None else self.decoders_cost(self.bucket(decoders))
        if base is None:
            return self.min_tokens
        allowed = self.multiple * base
        rows = self.bucket(decoders)
        while rows < decoders + self.max_tokens:
            cost = self.mixed_cost(self._larger(rows), decoders)
            if cost is None or cost > allowed:
                break
            rows = self._larger(rows)
        tokens = max(self.min_tokens, min(self.max_tokens, rows - decoders))
        if self.padded:  # the floor may cross into a bucket: its rows are paid for, fill them
            tokens = min(self.max_tokens, self.bucket(decoders + tokens) - decoders)
        return tokens

    def keys(self, decoders: int, tokens: int, starting: int = 0) -> int | None:
        """Prompt keys the step's chunks may attend (each chunk token x its end position),
        beside `decoders` with `tokens` prompt tokens; None: no limit (not paced, or no
        per-key cost learned: none yet, or a slope of zero).

        A chunk attends over its prompt's whole prefix in every layer: a step of 31
        decoders and 33 prompt tokens cost 164 ms at position 0 and 312 ms at 1,967 (eager,
        under load), so a bucket's time alone let the steps late in a long prompt grow
        past the multiple. What the bucket leaves of the allowed time, at the learned cost
        per key (`per_key`), is what the chunks may attend; the scheduler still gives the
        step's first chunk its MIN_CHUNK tokens.
        """
        per_key = self.per_key
        if not self.paced(decoders, starting) or not per_key:
            return None
        reference = self.decoders_cost(self.bucket(max(decoders, self.reference_rows)))
        rows = self.mixed_cost(self.bucket(decoders + tokens), decoders)
        if reference is None or rows is None:
            return None
        return max(0, int((self.multiple * reference - rows) / per_key))

    def plan(self, decoders: int, start: int | None, starting: int = 0) -> tuple[int, int | None]:
        """The next step's prompt tokens and keys (`budget`, `keys`) for a first chunk from
        position `start` (None: no prompt to feed): the bucket in which it feeds the most.

        `budget` takes the largest bucket within the multiple, and `keys` what that bucket
        leaves: late in a long prompt next to 31 decoders almost nothing, so the chunk fell to
        15-20 tokens and the step to a smaller bucket that cost well under what was allowed
        (~45 ms of 53 at a multiple of 1.7, 2-core Xeon with AMX). A smaller bucket leaves
        more for keys; of the buckets up to the budget's, the one whose chunk feeds the most
        tokens within both bounds is taken, the smaller on a tie."""
        tokens = self.budget(decoders, starting)
        keys = self.keys(decoders, tokens, starting)
        if keys is None or start is None:
            return tokens, keys
        best = (0, tokens, keys)
        bucket = self.bucket(decoders + 1)
        while bucket - decoders < tokens:
            rows = bucket - decoders
            allowed = self.keys(decoders, rows, starting)
            fed = min(rows, chunk_fitting(start, allowed))
            if allowed is not None and fed > best[0]:
                best = (fed, rows, allowed)
            bucket = self._larger(bucket)
        if min(tokens, chunk_fitting(start, keys)) > best[0]:
            return tokens, keys
        return best[1], best[2]

    @property
    def per_key(self) -> float:
        """The cost of a prompt key: the fitted slope, at least the measured `key_floor`.

        Fitted from whole steps, the slope is noise over a small term: in one run on a Xeon
        with AMX it read 0, which lifted the key bound (`keys` None), and the decoders'
        ITL p99 while a 2,000-token prompt prefilled went to 2.95x their p50 before. The
        floor is the chunk attention's own cost per key, timed at start
        (`LlamaRunner.chunk_key_seconds`): a key cannot add less to a step than that."""
        return max(self.key_seconds or 0.0, self.key_floor)

    def alone_tokens(self, decoders: int, starting: int = 0) -> int:
        """Prompt tokens a prefill-only step may take before the decoders' next step; 0: none
        (also when not paced: the decoders' own step then takes every prompt it can).

        A short prompt arriving while 31 decode, fed beside them, waits for the step in
        flight and then a step costing 1.6 decode steps (two, if it does not fit the bucket
        left): 3.4x its time to first token on an idle engine. Alone, it waits for the step
        in flight and then a step of its own rows. The decoders pay that step once: allowed
        while it costs at most `multiple` reference decode steps (a mixed step may cost as
        much, and the split prompt took two of them), in the largest prefill-only bucket
        measured (or seeded) within that. Bounded by one decode step instead, a 37-token
        prompt's 64-row step (int8 on the AMX template, about a 32-row decode step's cost)
        rarely qualified: it went in two mixed steps, 3.5x its idle time to first token.
        """
        if not self.paced(decoders, starting):
            return 0
        reference = self.decoders_cost(self.bucket(max(decoders, self.reference_rows)))
        if reference is None:
            return 0
        fits = [rows for rows, cost in self.alone.items() if cost <= self.multiple * reference]
        return min(self.max_tokens, max(fits, default=0))

    def bucket(self, rows: int) -> int:
        """The row bucket a step of `rows` rows is timed under: the smallest compiled one
        holding it once seeded, else (and past the largest) the power of two at or above."""
        fits = [b for b in self.buckets if b >= rows]
        return fits[0] if fits else _bucket(rows)

    def _larger(self, bucket: int) -> int:
        """The next bucket up."""
        return self.bucket(bucket + 1)

    def _smaller(self, bucket: int) -> int:
        """The next bucket down (the power of two below, under the compiled ones)."""
        below = [b for b in self.buckets if b < bucket]
        return below[-1] if below else max(bucket // 2, 1)

    def decoders_cost(self, bucket: int) -> float | None:
        """What the decoders' own step costs: its bucket's time, or an adjacent bucket's.

        While prompts keep arriving no step is decode-only, so the decoders' bucket may
        never be measured alone; the one just below or above it is a close stand-in.
        """
        for neighbour in (bucket, self._smaller(bucket), self._larger(bucket)):
            if neighbour in self.seconds:
                return self.seconds[neighbour]
        return None

    def mixed_cost(self, bucket: int, decoders: int) -> float | None:
        """A step of `bucket` rows beside `decoders` decoding: their own step as it costs now,
        plus what the rows beyond their bucket add to a prefill-only step (`alone`), where
        both buckets' prefill-only times are known; else the bucket's own learned time.

        The decoders' step grows with their histories (their attention reads every key they
        hold): 31 decoders went from 28 to 41 ms a step while a 2,000-token prompt prefilled
        beside them (Xeon with AMX). Every step of that prompt is mixed, so a mixed bucket's
        learned time is as old as its last use: the 64-row bucket, last used early in the
        prompt, still read 33 ms while the 40-row one read 41. Built from the decoders'
        current step (`observe` infers it from mixed steps) and the prefill-only deltas,
        which do not drift, every bucket's estimate is as fresh as the last step."""
        own = self.bucket(decoders)
        base = self.decoders_cost(own)
        if base is None or bucket not in self.alone or own not in self.alone:
            return self.estimate(bucket)
        return base + self._added(bucket, own)

    def _added(self, bucket: int, own: int) -> float:
        """What a prefill-only step of `bucket` rows costs beyond one of `own` rows, never
        less than nothing: more rows through the same kernels cannot cost less, though two
        warm-up timings on a noisy machine may say so (the 40-row bucket 76 ms alone against
        the 32-row's 86, 2-core AMD EPYC Zen 3). Taken as it read, every 40-row mixed step
        said the decoders' own step cost 10 ms more than the whole step did."""
        return max(0.0, self.alone[bucket] - self.alone[own])

    def estimate(self, bucket: int) -> float | None:
        """A step of `bucket` rows: measured, else bounded above by measured neighbours."""
        if bucket in self.seconds:
            return self.seconds[bucket]
        larger = [b for b in self.seconds if b > bucket]
        if larger:
            return self.seconds[min(larger)]
        smaller = [b for b in self.seconds if b < bucket]
        if smaller:
            below = max(smaller)
            return self.seconds[below] * bucket / below
        return None

    def seed(
        self,
        seconds_by_rows: dict[int, float],
        alone_by_rows: dict[int, float] | None = None,
        key_seconds: float | None = None,
    ) -> None:
        """Step times measured elsewhere (the compiled graphs' warm-up), for the buckets this
        pacer has not measured itself; from now on steps run padded to their bucket.
        `alone_by_rows`: prefill-only steps' times by bucket, where measured apart (the
        step's own time stands in for the others). `key_seconds`: a chunk's attention per
        key, measured apart (the floor of `per_key`).

        Padded, the floor (`min_tokens`) beside 29 decoders makes a 37-row step that costs
        the whole 64-row bucket: left at 8 prompt tokens, a 32-prompt burst's last five
        prompts took 13 such steps (8 tokens each, ~115 ms) before their first token, where
        filling the bucket feeds 35 a step.
        """
        self.padded = True
        self.buckets = tuple(sorted(seconds_by_rows))
        self.key_floor = key_seconds or 0.0
        alone = alone_by_rows or {}
        for rows, seconds in seconds_by_rows.items():
            self.seconds.setdefault(rows, seconds)
            self.alone.setdefault(rows, alone.get(rows, seconds))

    def observe(
        self, decoders: int, prefill_tokens: int, seconds: float, prefill_keys: int = 0
    ) -> None:
        """Learn from a finished step: its time, under its row bucket, or per prompt key.

        A prefill-only step is kept apart (`alone`): it costs less than one of the same
        rows with decoders (their attention over their histories), and as an upper bound
        for a bigger mixed bucket it let 31 decoders wait on 128-row eager steps at 2.1x
        their own. With decoders, the per-key cost is the slope of time over keys within
        each bucket across the latest steps (a long prompt's chunks attend more keys step
        after step in the same bucket), and the bucket keeps its time net of its keys; the
        decoders' own bucket learns what the step says their step costs now, its time less
        the prefill-only delta between the two buckets (`mixed_cost`).
        """
        key = self.bucket(decoders + prefill_tokens)
        if decoders:
            self.recent.append((key, prefill_keys, seconds))
            self._fit_key_seconds()
            seconds -= self.per_key * prefill_keys
            own = self.bucket(decoders)
            if own != key and own in self.alone and key in self.alone:
                self._learn(self.seconds, own, seconds - self._added(key, own))
        self._learn(self.seconds if decoders else self.alone, key, seconds)

    @staticmethod
    def _learn(table: dict[int, float], bucket: int, seconds: float) -> None:
        """Move a bucket's time towards a new measurement (taken as it is when the first)."""
        old = table.get(bucket)
        table[bucket] = seconds if old is None else old + SMOOTHING * (seconds - old)

    def _fit_key_seconds(self) -> None:
        """Least squares of time over keys with a level per bucket, on `recent`; kept as
        it was while the keys do not vary within a bucket."""
        by_bucket: dict[int, list[tuple[int, float]]] = {}
        for bucket, keys, seconds in self.recent:
            by_bucket.setdefault(bucket, []).append((keys, seconds))
        sxx = sxy = 0.0
        for points in by_bucket.values():
            mean_x = sum(x for x, _ in points) / len(points)
            mean_y = sum(y for _, y in points) / len(points)
            sxx += sum((x - mean_x) ** 2 for x, _ in points)
            sxy += sum((x - mean_x) * (y - mean_y) for x, y in points)
        if sxx > 0:
            self.key_seconds = max(sxy / sxx, 0.0)
