"""Streaming a text part from the in-process engine to the database and the browsers.

The engine calls back on its own thread and must never wait, so events go into a queue that
one writer thread per web process drains: it numbers each text piece, appends it to the live
tail in Redis, broadcasts `part.delta`, saves the text at most every SAVE_INTERVAL seconds
(and at the end), and finishes the part through the guarded `chat.parts`.
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


class TextStreamWriter:
    """Drains engine events for every streaming text part of this process."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[int, EngineEvent, float, contextvars.Context]] = (
            queue.SimpleQueue()
        )
        self._live: dict[int, LivePart] = {}
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

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
            live_text.append(part_id, event.text)
            part = live.part
            delta = events.delta_event(part.pk, part.message_id, live.seq, event.text, emitted)
            events.send(live.conversation_id, delta)
        if event.is_finished:
            self._finish(live, event)
        elif time.monotonic() - live.saved_at >= SAVE_INTERVAL and live.seq != live.saved_seq:
            self._save(live)

    def _save(self, live: LivePart) -> None:
        part_update(live.part, text=live.text, seq=live.seq)
        live.saved_seq, live.saved_at = live.seq, time.monotonic()

    def _finish(self, live: LivePart, event: EngineEvent) -> None:
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


writer = TextStreamWriter()
