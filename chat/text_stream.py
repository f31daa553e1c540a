"""Streaming a text part from the in-process engine to the database and the browsers.

The engine calls back on its own thread and must never wait, so events go into a queue that
one writer thread per web process drains: it numbers each text piece, appends it to the live
tail in Redis, broadcasts `part.delta`, saves the text at most every SAVE_INTERVAL seconds
(and at the end), and finishes the part through the guarded `chat.parts`.

While Redis is down the writer skips the tail and the deltas without calling Redis (a
`RedisGate` probes it at most every second), so it keeps pace with the engine and the text
still reaches the database; when Redis answers, a part whose appends were skipped gets its
whole tail written again before the next piece.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from django.db import close_old_connections
from django.utils import timezone

from chat import events, live_text
from chat.models import Part
from chat.parts import part_transition, part_update
from config.logging import bind as bind_log_ids
from config.redis_client import RedisGate
from inference.engine import EngineEvent, FinishReason

log = logging.getLogger(__name__)
SAVE_INTERVAL = 0.5

FINAL_STATE = {
    FinishReason.LENGTH: Part.State.SUCCEEDED,
    FinishReason.EOS_TOKEN: Part.State.SUCCEEDED,
    FinishReason.STOP_SEQUENCE: Part.State.SUCCEEDED,
    FinishReason.CANCELLED: Part.State.CANCELLED,
    FinishReason.ERROR: Part.State.FAILED,
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


class TextStreamWriter:
    """Drains engine events for every streaming text part of this process."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[int, EngineEvent, float, contextvars.Context]] = (
            queue.SimpleQueue()
        )
        self._live: dict[int, LivePart] = {}
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._redis = RedisGate()

    def callback(self, part_id: int):
        """The engine's on_event for one part: enqueue with the emission time, return at once.

        The caller's logging ids (its request and message) are copied, with the part's id
        added, and the writer handles each of the part's events inside that copy: a thread
        does not inherit context variables by itself.
        """
        context = contextvars.copy_context()
        context.run(bind_log_ids, part_id=part_id)

        def on_event(event: EngineEvent) -> None:
            self._queue.put((part_id, event, time.time(), context))

        return on_event

    def ensure_running(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="text-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            part_id, event, emitted, context = self._queue.get()
            try:
                context.run(self._handle, part_id, event, emitted)
            except Exception:  # one bad part must not stop everyone else's text
                log.exception("text writer failed on part %s", part_id, extra={"part_id": part_id})
            finally:
                close_old_connections()

    def _live_part(self, part_id: int) -> LivePart | None:
        live = self._live.get(part_id)
        if live is None:
            part = Part.objects.select_related("message").filter(pk=part_id).first()
            if part is None:
                return None
            live = LivePart(part, part.message.conversation_id, part.text, part.seq, part.seq)
            self._live[part_id] = live
        return live

    def _handle(self, part_id: int, event: EngineEvent, emitted: float) -> None:
        live = self._live_part(part_id)
        if live is None:
            return
        if event.token_id is not None and event.index == 0:
            part_update(live.part, first_token_at=timezone.now())
        if event.text:
            live.seq += 1
            live.text += event.text
            live.pieces.append(event.text)
            self._publish(live, event.text, emitted)
        if event.is_finished:
            self._finish(live, event, emitted)
        elif time.monotonic() - live.saved_at >= SAVE_INTERVAL and live.seq != live.saved_seq:
            self._save(live)

    def _publish(self, live: LivePart, text: str, emitted: float) -> None:
        """Append the piece to the live tail and broadcast it, or skip both while Redis is down.

        The tail is rebuilt whole when appends were skipped, so item n is always delta n.
        """
        if not self._redis.open():
            live.tail_behind = True
            return
        part = live.part
        if live.tail_behind:
            recorded = live_text.rebuild(part.pk, live.pieces)
        else:
            recorded = live_text.append(part.pk, text)
        live.tail_behind = not recorded
        delta = events.delta_event(part.pk, part.message_id, live.seq, text, emitted)
        if not recorded or not events.send(live.conversation_id, delta):
            self._redis.failed()

    def _save(self, live: LivePart) -> None:
        part_update(live.part, text=live.text, seq=live.seq)
        live.saved_seq, live.saved_at = live.seq, time.monotonic()

    def _finish(self, live: LivePart, event: EngineEvent, emitted: float) -> None:
        """Save the whole text with the final state; log how far behind the engine it came."""
        del self._live[live.part.pk]
        fields: dict = {
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
        part_transition(live.part.pk, FINAL_STATE[event.finish_reason], **fields)
        live_text.expire(live.part.pk)
        behind = time.time() - emitted
        log.info(
            "text part %s final %.3f s after the engine's last event",
            live.part.pk,
            behind,
            extra={"part_id": live.part.pk},
        )


writer = TextStreamWriter()
