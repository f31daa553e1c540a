"""How a request ends: its KV and queue place freed at once, its final event delivered, and a
fault ending only the requests it touched (docs/engine.md, "Failure isolation")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from inference.engine.events import EngineEvent, FinishReason
from inference.engine.sequence import Sequence, Status

if TYPE_CHECKING:
    from inference.engine.batch import StepBatch
    from inference.engine.scheduler import Scheduler
    from inference.engine.stats import Counters

# Under the engine's name: these are the loop's faults, logged where its others are.
logger = logging.getLogger("inference.engine.engine")


class Closing:
    """`Engine`'s request endings, mixed into it: every way out of the engine (done, cancelled,
    failed, shut down) frees the same things and tells the caller exactly once.

    What it uses of the engine is declared below; `_active` (the requests not yet ended, by
    id) is the engine's, under its lock.
    """

    scheduler: Scheduler
    _lock: threading.Lock
    _active: dict[str, Sequence]
    _counts: Counters
    _observe: Callable[..., None]
    cancel: Callable[[str], bool]

    def _fail_batch(self, batch: StepBatch, exc: Exception) -> None:
        """A fault of the whole step fails every request in it not already ended (a fault
        after some of its tokens went out: a newcomer's step run inside another's)."""
        logger.exception("Step failed; failing its %d requests", len(batch.sequences))
        for seq in batch.sequences:
            if seq.status is not Status.FINISHED:
                self._finish(seq, FinishReason.ERROR, error=describe(exc))

    def _fail_row(self, seq: Sequence, exc: Exception) -> None:
        """A fault in one row's sampling or post-processing fails that request only."""
        logger.exception("Post-processing failed for request %s", seq.request_id)
        if seq.status is not Status.FINISHED:
            self._finish(seq, FinishReason.ERROR, error=describe(exc))

    def _finish(self, seq: Sequence, reason: FinishReason, *, error: str | None = None) -> None:
        """End a request without a new token (cancelled, failed, shut down) and tell its caller."""
        self._emit(seq, self._close(seq, reason, error=error))

    def _close(
        self,
        seq: Sequence,
        reason: FinishReason,
        *,
        last: EngineEvent | None = None,
        error: str | None = None,
    ) -> EngineEvent:
        """Free the request's KV and queue place now; returns its final event to emit."""
        if seq.status is Status.RUNNING:
            self.scheduler.release(seq, keep=reason is not FinishReason.ERROR)
        elif seq.status is Status.WAITING:
            with self._lock:
                self.scheduler.remove_waiting(seq)
        seq.status = Status.FINISHED
        with self._lock:
            self._active.pop(seq.request_id, None)
        event = seq.final_event(reason, time.monotonic(), last, error)
        self._counts.requests_finished += 1
        self.scheduler.record_duration(event.timings.duration)
        self._observe("on_finish", seq.request_id, reason, event.usage, event.timings)
        return event

    def _emit(self, seq: Sequence, event: EngineEvent) -> None:
        """Deliver an event; a failing callback cancels its request, never the engine."""
        try:
            seq.on_event(event)
        except Exception:
            logger.exception("on_event for request %s failed; cancelling it", seq.request_id)
            if not event.is_finished:
                self.cancel(seq.request_id)

    def _fail_remaining(self) -> None:
        """On shutdown: every unfinished request gets an error event."""
        with self._lock:
            pending = list(self._active.values())
        for seq in pending:
            if seq.status is not Status.FINISHED:
                self._finish(seq, FinishReason.ERROR, error="The engine shut down.")


def describe(exc: BaseException) -> str:
    """The error text a failed request's final event carries: the exception's type and message."""
    return f"{type(exc).__name__}: {exc}"
