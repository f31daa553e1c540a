"""Streaming a text part from the engine to the database and the browsers.

The events come from the in-process engine or, with TANDEM_ENGINE set to URLs, from
`inference.provisioning.remote_engine`, which makes the same events out of an OpenAI stream.

The engine calls back on its own thread and must never wait, so events go into a queue that
one writer thread per web process drains: it numbers each text piece, appends it to the live
tail in Redis, broadcasts `part.delta`, saves the text at most every SAVE_INTERVAL seconds
(and at the end), and finishes the part through the guarded `chat.parts`.

The writer works in rounds, not per token: it takes every event the queue holds, applies
them to its parts in memory, then flushes. A flush sends every part's gathered pieces as one
delta each (their seq range), all the parts' tail appends and PUBLISHes in one Redis
pipeline, at most every WINDOW seconds (at once when the writer was idle longer, and for a
part that gathered FLUSH_SIZE characters); every SAVE_INTERVAL it saves the text of every
part that moved in one UPDATE (`chat.parts.parts_update`), after sending their pieces, on a
database connection it keeps. At hundreds of replies the cost per token is so a list append
and a few attribute writes; per window and part one delta; per interval one statement
(docs/deploy.md, "Live replies per web process").

While Redis is down the writer skips the tail and the deltas without calling Redis (a
`RedisGate` probes it at most every second), so it keeps pace with the engine and the text
still reaches the database; when Redis answers, a part whose appends were skipped gets its
whole tail written again before the next piece.

While the database is down the writer goes on numbering, tailing and broadcasting: browsers
keep receiving the text. A save that fails is tried again at the next interval, and a part
that ends during the outage keeps its final save (text, seq, state, usage) until it goes
through: the writer retries it every RETRY_INTERVAL while it waits for events, so the saved
text equals the streamed text once the database is back. The writer needs the database for
nothing else: each part's conversation is known when its callback is made.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from django.db import DatabaseError
from django.utils import timezone
from redis import RedisError

from chat import events, live_text
from chat.kept_connections import IDLE_CLOSE, reset_connection
from chat.models import Part
from chat.parts import part_transition, part_update, parts_update
from config.logging import bind as bind_log_ids
from config.logging import bound as bound_log_ids
from config.redis_client import RedisGate, redis_client
from inference.engine import EngineEvent, FinishReason

log = logging.getLogger(__name__)
SAVE_INTERVAL = 0.5
WINDOW = 0.1  # seconds between flushes of a busy writer (its pieces' longest wait)
FLUSH_SIZE = 2048  # characters gathered that go out at once
RETRY_INTERVAL = 0.5  # seconds between tries of the final saves that failed
ROUND = 8192  # events applied at most between two flushes
END_BUDGET = 0.02  # seconds of final saves a round, before the others' pieces go on

FINAL_STATE = {
    FinishReason.LENGTH: Part.State.SUCCEEDED,
    FinishReason.EOS_TOKEN: Part.State.SUCCEEDED,
    FinishReason.STOP_SEQUENCE: Part.State.SUCCEEDED,
    FinishReason.CANCELLED: Part.State.CANCELLED,
    FinishReason.ERROR: Part.State.FAILED,
    FinishReason.INTERRUPTED: Part.State.INTERRUPTED,
}


@dataclass
class LivePart:
    """The writer's running view of one streaming part."""

    part: Part
    conversation_id: int
    base: str  # the text saved before this run (empty for a new part)
    seq: int
    saved_seq: int
    pieces: list[str] = field(default_factory=list)  # this run's deltas, to rebuild the tail
    tail_behind: bool = False  # an append was skipped: the tail must be rebuilt first
    unsaved: dict = field(default_factory=dict)  # fields a failed save still owes the row
    deferred: bool = False  # a save failed and none has succeeded since (logged once)
    final: tuple[str, dict, float] | None = None  # (state, fields, emitted) not saved yet
    gathered: list[str] = field(default_factory=list)  # pieces not sent yet
    gathered_size: int = 0  # their characters
    gathered_emitted: float = 0.0  # when the engine emitted the first of them (time.time())

    @property
    def text(self) -> str:
        """The whole text so far, joined when saved (appending to a string per token would
        copy the reply so far each time)."""
        return self.base + "".join(self.pieces)


class TextStreamWriter:
    """Drains engine events for every streaming text part of this process."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[LivePart, EngineEvent, float, contextvars.Context]] = (
            queue.SimpleQueue()
        )
        self._unsaved_ends: dict[int, LivePart] = {}  # parts that ended, final save pending
        self._retried_at = 0.0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._redis = RedisGate()
        self._gone: set[int] = set()  # parts whose rows were deleted: their events are dropped
        self._handling = threading.RLock()  # held while a round of events is handled
        self._gathering: dict[int, LivePart] = {}  # parts with pieces not sent yet
        self._moved: dict[int, LivePart] = {}  # parts whose row is behind their text
        self._flushed_at = 0.0  # when the last flush sent pieces (time.monotonic())
        self._saved_at = 0.0  # when the last batched save ran
        self._urgent = False  # a save is due at the next flush (a first token's time)
        self._saver = Saver()
        self._ending: deque[tuple[LivePart, EngineEvent, float, contextvars.Context]] = deque()

    def forget(self, part_ids: list[int]) -> None:
        """Drop every event still queued for these parts (their conversation was deleted).

        Returns once no event of theirs is being handled, so nothing of theirs is broadcast
        after the caller tells the pages the conversation is gone.
        """
        with self._handling:
            self._gone.update(part_ids)

    def callback(self, part: Part, conversation_id: int):
        """The engine's on_event for one streaming part: enqueue with the emission time,
        return at once.

        The caller's logging ids (its request and message) are copied, with the part's id
        added, and the writer handles each of the part's events inside that copy: a thread
        does not inherit context variables by itself.
        """
        live = LivePart(part, conversation_id, part.text, part.seq, part.seq)
        context = contextvars.copy_context()
        context.run(bind_log_ids, part_id=part.pk)

        def on_event(event: EngineEvent) -> None:
            self._queue.put((live, event, time.time(), context))

        return on_event

    def ensure_running(self) -> None:
        """Start the writer's thread, or start it again if a fault ended it."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="text-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        idle = False
        while True:
            timeout = self._timeout()
            if timeout is None and not idle:  # nothing to do: the connection goes after a while
                timeout = IDLE_CLOSE
            events = self._take(timeout)
            idle = not events and timeout == IDLE_CLOSE
            if idle:
                reset_connection()
            self._take_saves()
            with self._handling:
                for live, event, emitted, context in events:
                    self._apply(live, event, emitted, context)
                try:
                    self._flush(time.monotonic())
                except Exception:  # a bug in one flush must not stop the text for good
                    log.exception("text writer flush failed")
                self._end_some()
            if self._unsaved_ends and time.monotonic() - self._retried_at >= RETRY_INTERVAL:
                self._retry_ends()

    def _timeout(self) -> float | None:
        """How long to wait for the next event: until the next flush, save or retry is due."""
        now = time.monotonic()
        due = [now] if self._ending else []
        if self._gathering:
            due.append(self._flushed_at + WINDOW)
        if self._moved:
            due.append(now if self._urgent else self._saved_at + SAVE_INTERVAL)
        if self._unsaved_ends:
            due.append(self._retried_at + RETRY_INTERVAL)
        return max(0.0, min(due) - now) if due else None

    def _take(self, timeout: float | None) -> list:
        """Every queued event (at most ROUND), waiting up to `timeout` for the first."""
        try:
            taken = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while len(taken) < ROUND:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return taken

    def _apply(self, live: LivePart, event: EngineEvent, emitted: float, context) -> None:
        pk = live.part.pk
        if pk in self._gone:
            self._gathering.pop(pk, None)
            self._moved.pop(pk, None)
            if event.is_finished:
                self._gone.discard(pk)
            return
        try:
            if event.text:  # the common case, kept short: no call per token
                live.seq += 1
                live.pieces.append(event.text)
                if not live.gathered:
                    live.gathered_emitted = emitted
                    self._gathering[pk] = live
                live.gathered.append(event.text)
                live.gathered_size += len(event.text)
                self._moved[pk] = live
            if event.index == 0 and (event.token_id is not None or event.text):  # remote: no ids
                live.unsaved["first_token_at"] = timezone.now()
                self._moved[pk] = live
                self._urgent = True
            if event.is_finished:
                self._ending.append((live, event, emitted, context))
        except Exception:  # one bad part must not stop everyone else's text
            log.exception("text writer failed on part %s", pk)

    def _end_some(self) -> None:
        """End the parts that finished, for at most END_BUDGET seconds a round: each final
        save is a transaction of its own, and a Stop of hundreds of replies must not hold
        back the deltas of the others for seconds."""
        deadline = time.monotonic() + END_BUDGET
        while self._ending and time.monotonic() < deadline:
            live, event, emitted, context = self._ending.popleft()
            if live.part.pk in self._gone:
                self._gone.discard(live.part.pk)
                continue
            try:
                context.run(self._end, live, event, emitted)
            except Exception:  # one bad part must not stop everyone else's text
                log.exception("text writer failed on part %s", live.part.pk)

    def _end(self, live: LivePart, event: EngineEvent, emitted: float) -> None:
        """The part's last pieces go out, then its final save (which carries the whole text)."""
        self._publish([live])
        self._moved.pop(live.part.pk, None)
        self._finish(live, event, emitted)

    def _flush(self, now: float) -> None:
        """Send the gathered pieces when a window is over (or a part gathered FLUSH_SIZE
        characters), then the batched save when it is due."""
        save = bool(self._moved) and (self._urgent or now - self._saved_at >= SAVE_INTERVAL)
        if self._gathering and (
            save
            or now - self._flushed_at >= WINDOW
            or any(live.gathered_size >= FLUSH_SIZE for live in self._gathering.values())
        ):
            self._flushed_at = now
            self._publish(list(self._gathering.values()))
        if save:
            self._saved_at, self._urgent = now, False
            self._save(list(self._moved.values()))

    def _publish(self, lives: list[LivePart]) -> None:
        """Append each part's gathered pieces to its live tail and broadcast them as one delta,
        all in one Redis pipeline, or skip both while Redis is down.

        A part's tail is rebuilt whole when appends were skipped, so item n is always piece n;
        a reader that missed the skipped deltas mends them from it (`chat.resume`).
        """
        sending: list[tuple[LivePart, list[str]]] = []
        for live in lives:
            gathered, live.gathered, live.gathered_size = live.gathered, [], 0
            self._gathering.pop(live.part.pk, None)
            if gathered and live.part.pk not in self._gone:  # a deleted part's pieces go nowhere
                sending.append((live, gathered))
        if not sending:
            return
        if not self._redis.open():
            for live, _ in sending:
                live.tail_behind = True
            return
        pipe = redis_client().pipeline(transaction=False)
        commands: list[LivePart | None] = []  # per command: the part whose tail it appends
        for live, gathered in sending:
            part = live.part
            if live.tail_behind:
                live.tail_behind = not live_text.rebuild(part.pk, live.pieces)
                if live.tail_behind:
                    self._redis.failed()
                    continue
            else:
                live_text.append_in(pipe, part.pk, gathered)
                commands.append(live)
            first = live.seq - len(gathered) + 1
            delta = events.delta_event(
                part.pk, part.message_id, live.seq, "".join(gathered), live.gathered_emitted, first
            )
            events.send_in(pipe, live.conversation_id, delta)
            commands.append(None)
        try:
            results = pipe.execute(raise_on_error=False)
        except (RedisError, OSError) as exc:
            log.warning("live tail and deltas of %s parts skipped: %s", len(sending), exc)
            results = [exc] * len(commands)
        failed = False
        for appending, result in zip(commands, results, strict=True):
            if isinstance(result, Exception):
                failed = True
                if appending is not None:
                    appending.tail_behind = True
        if failed:
            self._redis.failed()

    def _save(self, lives: list[LivePart]) -> None:
        """Hand the text so far of every part that moved (and what earlier failed saves owed)
        to the saver thread, unless it is still saving the last batch (they go next time)."""
        changes = [(live, {"text": live.text, "seq": live.seq, **live.unsaved}) for live in lives]
        self._saver.submit(changes)

    def _take_saves(self) -> None:
        """Apply the outcomes of the saver's finished batches to the parts."""
        while True:
            try:
                outcomes = self._saver.outcomes.get_nowait()
            except queue.Empty:
                return
            for live, fields, error in outcomes:
                if error is None:
                    self._saved(live, fields)
                elif not live.deferred:
                    log.warning("text part %s: saves deferred: %s", live.part.pk, error)
                    live.deferred = True

    def _saved(self, live: LivePart, fields: dict) -> None:
        if live.deferred:
            log.info("text part %s: saved again, up to seq %s", live.part.pk, fields["seq"])
        live.saved_seq, live.deferred = fields["seq"], False
        for name, value in fields.items():
            if live.unsaved.get(name) is value:
                del live.unsaved[name]
        if live.seq == fields["seq"] and not live.unsaved and self._moved.get(live.part.pk) is live:
            del self._moved[live.part.pk]

    def _finish(self, live: LivePart, event: EngineEvent, emitted: float) -> None:
        """Save the whole text with the final state, or keep it to retry while the database
        is down."""
        fields: dict = {
            **live.unsaved,
            "text": live.text,
            "seq": live.seq,
            "finished_at": timezone.now(),
            "finish_reason": event.finish_reason.value,
        }
        if event.usage is not None:
            fields["prompt_tokens"] = event.usage.prompt_tokens
            fields["completion_tokens"] = event.usage.completion_tokens
        if event.error:
            fields["error"] = f"The engine failed while writing this reply: {event.error}"
        live.final = (FINAL_STATE[event.finish_reason], fields, emitted)
        if not self._save_end(live):
            log.warning("text part %s: final save deferred (database unavailable)", live.part.pk)
            self._unsaved_ends[live.part.pk] = live

    def _save_end(self, live: LivePart) -> bool:
        """The part's final transition; False when the database refused it (kept for later).
        Logs how far behind the engine's last event the part became final."""
        state, fields, emitted = live.final
        try:
            part_transition(live.part.pk, state, **fields)
        except DatabaseError:
            reset_connection()
            return False
        live_text.expire(live.part.pk)
        behind = time.time() - emitted
        log.info(
            "text part %s final %.3f s after the engine's last event",
            live.part.pk,
            behind,
            extra={"part_id": live.part.pk},
        )
        return True

    def _retry_ends(self) -> None:
        """Try the pending final saves, oldest first; stop at the first refusal."""
        self._retried_at = time.monotonic()
        for part_id, live in list(self._unsaved_ends.items()):
            with bound_log_ids(part_id=part_id):
                if not self._save_end(live):
                    return
            del self._unsaved_ends[part_id]


Outcome = tuple[LivePart, dict, Exception | str | None]  # the part, its saved fields, the error


class Saver:
    """The writer's batched saves, on a thread of their own.

    A save waits for the database (SQLite's commit is an fsync; PostgreSQL's a round trip and
    its WAL flush): on the writer's thread that wait held up every part's deltas, 300 ms at
    the 99th percentile with 200 replies. Here the writer hands a batch over and goes on;
    one batch at a time, so a slow database makes batches bigger, never a queue of them.
    The outcomes come back on `outcomes` for the writer to apply to its parts. The UPDATE
    touches only rows still streaming, so a batch that lands after a part's final save
    cannot put older text over it.
    """

    def __init__(self) -> None:
        self.outcomes: queue.SimpleQueue[list[Outcome]] = queue.SimpleQueue()
        self._batch: list[tuple[LivePart, dict]] | None = None
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, changes: list[tuple[LivePart, dict]]) -> bool:
        """Start saving `changes`; False when the last batch is still being saved."""
        with self._ready:
            if self._batch is not None:
                return False
            self._batch = changes
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="text-saver", daemon=True)
                self._thread.start()
            self._ready.notify()
        return True

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._batch is None:
                    if not self._ready.wait(IDLE_CLOSE):
                        reset_connection()  # idle: let the connection go
                changes = self._batch
            try:
                self.outcomes.put(save_batch(changes))
            except Exception:  # a bug must not stop the saves for good
                log.exception("text saver failed on %s parts", len(changes))
            finally:
                with self._ready:
                    self._batch = None


def save_batch(changes: list[tuple[LivePart, dict]]) -> list[Outcome]:
    """Save the parts' text in one statement; when it fails, each part alone, so one part the
    database refuses does not hold back the others (two refusals before any success mean the
    database is down, and the rest wait too)."""
    try:
        parts_update([(live.part, fields) for live, fields in changes], streaming_only=True)
    except DatabaseError as exc:
        reset_connection()
        log.warning("batched save of %s text parts failed: %s", len(changes), exc)
    else:
        return [(live, fields, None) for live, fields in changes]
    outcomes: list[Outcome] = []
    refused = succeeded = 0
    for live, fields in changes:
        if refused >= 2 and not succeeded:
            outcomes.append((live, fields, "the database refused the saves before it"))
            continue
        try:
            part_update(live.part, streaming_only=True, **fields)
        except DatabaseError as exc:
            reset_connection()
            refused += 1
            outcomes.append((live, fields, exc))
        else:
            succeeded += 1
            outcomes.append((live, fields, None))
    return outcomes


writer = TextStreamWriter()
