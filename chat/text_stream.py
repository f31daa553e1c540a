"""Streaming a text part from the engine to the database and the browsers.

The events come from the in-process engine or, with TANDEM_ENGINE set to URLs, from
`inference.provisioning.remote_engine`, which makes the same events out of an OpenAI stream.

The engine calls back on its own thread and must never wait, so events go into a queue that
one writer thread per web process drains: it numbers each text piece, appends it to the live
tail in Redis, broadcasts `part.delta`, saves the text at most every SAVE_INTERVAL seconds
(and at the end), and finishes the part through the guarded `chat.parts`.

A part's pieces go out together, as one delta carrying their seq range: whatever the queue
holds when the writer reaches the end of it, or what gathered over WINDOW seconds when the
queue never empties, or FLUSH_SIZE characters; at once before a save and at the end. An idle
writer so adds no delay, and a busy one sends one tail append and one PUBLISH per part and
window, however many pieces and readers.

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
from dataclasses import dataclass, field

from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from chat import events, live_text
from chat.models import Part
from chat.parts import part_transition, part_update
from config.logging import bind as bind_log_ids
from config.logging import bound as bound_log_ids
from config.redis_client import RedisGate
from inference.engine import EngineEvent, FinishReason

log = logging.getLogger(__name__)
SAVE_INTERVAL = 0.5
WINDOW = 0.05  # seconds a part's pieces may wait to go out together
FLUSH_SIZE = 2048  # characters gathered that go out at once
RETRY_INTERVAL = 0.5  # seconds between tries of the final saves that failed

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
    text: str
    seq: int
    saved_seq: int
    saved_at: float = field(default_factory=time.monotonic)
    pieces: list[str] = field(default_factory=list)  # this run's deltas, to rebuild the tail
    tail_behind: bool = False  # an append was skipped: the tail must be rebuilt first
    unsaved: dict = field(default_factory=dict)  # fields a failed save still owes the row
    deferred: bool = False  # a save failed and none has succeeded since (logged once)
    final: tuple[str, dict, float] | None = None  # (state, fields, emitted) not saved yet
    gathered: list[str] = field(default_factory=list)  # pieces not sent yet
    gathered_at: float = 0.0  # when the first of them came (time.monotonic())
    gathered_emitted: float = 0.0  # when the engine emitted the first of them (time.time())


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
        self._handling = threading.RLock()  # held while one event is handled
        self._gathering: dict[int, LivePart] = {}  # parts with pieces not sent yet

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
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="text-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                timeout = RETRY_INTERVAL if self._unsaved_ends else None
                live, event, emitted, context = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._retry_ends()
                continue
            try:
                with self._handling:
                    if live.part.pk in self._gone:
                        self._gathering.pop(live.part.pk, None)
                        if event.is_finished:
                            self._gone.discard(live.part.pk)
                        continue
                    context.run(self._handle, live, event, emitted)
            except Exception:  # one bad part must not stop everyone else's text
                log.exception("text writer failed on part %s", live.part.pk)
            finally:
                close_old_connections()
            if self._gathering:
                self._send_gathered(everything=self._queue.empty())
            if self._unsaved_ends and time.monotonic() - self._retried_at >= RETRY_INTERVAL:
                self._retry_ends()

    def _handle(self, live: LivePart, event: EngineEvent, emitted: float) -> None:
        if event.index == 0 and (event.token_id is not None or event.text):  # remote: no ids
            live.unsaved["first_token_at"] = timezone.now()
            self._save(live)
        if event.text:
            live.seq += 1
            live.text += event.text
            live.pieces.append(event.text)
            self._gather(live, event.text, emitted)
        if event.is_finished:
            self._publish(live)
            self._finish(live, event, emitted)
        elif time.monotonic() - live.saved_at >= SAVE_INTERVAL and live.seq != live.saved_seq:
            self._publish(live)
            self._save(live)

    def _gather(self, live: LivePart, text: str, emitted: float) -> None:
        if not live.gathered:
            live.gathered_at, live.gathered_emitted = time.monotonic(), emitted
            self._gathering[live.part.pk] = live
        live.gathered.append(text)
        if sum(map(len, live.gathered)) >= FLUSH_SIZE:
            self._publish(live)

    def _send_gathered(self, everything: bool) -> None:
        """Send every part's gathered pieces (the queue is empty: nothing more to wait for),
        or those of parts whose window is over."""
        now = time.monotonic()
        with self._handling:
            while self._gathering:
                live = next(iter(self._gathering.values()))  # the oldest window first
                if not everything and now - live.gathered_at < WINDOW:
                    return
                try:
                    with bound_log_ids(part_id=live.part.pk):
                        self._publish(live)
                except Exception:  # one bad part must not stop everyone else's text
                    log.exception("text writer failed on part %s", live.part.pk)

    def _publish(self, live: LivePart) -> None:
        """Append the gathered pieces to the live tail and broadcast them as one delta, or skip
        both while Redis is down.

        The tail is rebuilt whole when appends were skipped, so item n is always piece n; a
        reader that missed the skipped deltas mends them from it (`chat.resume`).
        """
        gathered, live.gathered = live.gathered, []
        self._gathering.pop(live.part.pk, None)
        if not gathered or live.part.pk in self._gone:  # a deleted part's pieces go nowhere
            return
        if not self._redis.open():
            live.tail_behind = True
            return
        part = live.part
        if live.tail_behind:
            recorded = live_text.rebuild(part.pk, live.pieces)
        else:
            recorded = live_text.append(part.pk, *gathered)
        live.tail_behind = not recorded
        first = live.seq - len(gathered) + 1
        delta = events.delta_event(
            part.pk, part.message_id, live.seq, "".join(gathered), live.gathered_emitted, first
        )
        if not recorded or not events.send(live.conversation_id, delta):
            self._redis.failed()

    def _save(self, live: LivePart) -> None:
        """Save the text so far (and what earlier failed saves owed); a failure waits for the
        next interval, the text is kept here."""
        live.saved_at = time.monotonic()
        try:
            part_update(live.part, text=live.text, seq=live.seq, **live.unsaved)
        except DatabaseError as exc:
            if not live.deferred:
                log.warning("text part %s: saves deferred: %s", live.part.pk, exc)
            live.deferred = True
            return
        if live.deferred:
            log.info("text part %s: saved again, up to seq %s", live.part.pk, live.seq)
        live.saved_seq, live.deferred = live.seq, False
        live.unsaved.clear()

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
        try:
            for part_id, live in list(self._unsaved_ends.items()):
                with bound_log_ids(part_id=part_id):
                    if not self._save_end(live):
                        return
                del self._unsaved_ends[part_id]
        finally:
            close_old_connections()


writer = TextStreamWriter()
