"""A newcomer's prompt run inside the decode step in flight (docs/engine.md, "Scheduling policy").

Without it, a short prompt arriving during the decoders' step waits for the rest of that step:
on average half a decode step, most of the gap between its time to first token under load and
idle. `Engine._cut_in` is the `interrupt` callback the attention op asks before each layer of
a step planned by `Scheduler.schedule`; when the pacer would run the newcomer's prompt alone
next anyway, it runs that step right there and the paused step goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine.batch import StepBatch
    from inference.engine.kv_cache import KVCache
    from inference.engine.pacing import PrefillPacer
    from inference.engine.scheduler import Scheduler
    from inference.engine.stats import Counters
    from inference.engine.step_attention import ArrivalFlag


class CutIn:
    """`Engine`'s newcomer cut-in, mixed into it: the step alone a newcomer gets, and running
    it inside the step in flight.

    What it uses of the engine is declared below; `_arrived` (a request was submitted since
    the last plan) and `_paused_seconds` (time spent in newcomers' steps run inside others,
    which `_run` takes off the paused step's time) are the engine's, under its lock.
    """

    scheduler: Scheduler
    cache: KVCache
    pacer: PrefillPacer
    _lock: threading.Lock
    _counts: Counters
    _arrived: ArrivalFlag
    _paused_seconds: float
    _run: Callable[[StepBatch], None]
    _fail_batch: Callable[[StepBatch, Exception], None]
    _observe: Callable[..., None]

    def _plan_alone(self, decoders: int, starting: int) -> StepBatch | None:
        """The prefill-only step of whole short prompts the pacer allows next (the lock held)."""
        return self.scheduler.schedule_alone(self.pacer.alone_tokens(decoders, starting))

    def _admitted(self, batch: StepBatch) -> None:
        for seq in batch.admitted:
            self._observe("on_admit", seq.request_id, seq.admitted_at - seq.queued_at)

    def _cut_in(self, batch: StepBatch, layer: int) -> bool:
        """Run a prompt that arrived during `batch`'s step now, before `layer`, when the
        pacer would run it alone before the decoders' next step anyway (`alone_tokens`);
        True when its step moved the cache's rows, so `batch`'s must start over.

        The step in flight only pauses: the layers it ran stay done, and the decoders wait
        for the newcomer's step, which they would have waited for next anyway. Once a step
        at most; only a step planned by `schedule` pauses, not one right after a prompt's own
        step (decoders wait for one at most), and not while a burst's requests still start
        together (`burst_pending`).
        """
        if not self._arrived.is_set() or batch.interrupt is None:
            return False
        with self._lock:
            self._arrived.clear()
            if self.scheduler.burst_pending():
                return False
            version = self.cache.layout_version
            cut_in = self._plan_alone(self.scheduler.decoders(), self.scheduler.starting())
        if cut_in is None:
            return False
        batch.interrupt = None
        self._counts.steps_interrupted += 1
        self._admitted(cut_in)
        started = time.monotonic()
        try:
            self._run(cut_in)
        except Exception as exc:  # the newcomer's alone: the step it paused goes on
            self._fail_batch(cut_in, exc)
        self._paused_seconds += time.monotonic() - started
        return self.cache.layout_version != version
