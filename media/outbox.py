"""Image parts whose render task could not be sent, sent again as soon as the broker answers.

`media.services.image_enqueue` runs while a web request waits, so it cannot wait out a broker
outage: it leaves the part `queued` and hands it here. One daemon thread per process, alive
only while it holds parts, pings the broker every POLL seconds and, once it answers, sends
every part it holds, oldest first. The sweeper stays the backstop for a process that dies
holding parts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

log = logging.getLogger(__name__)

POLL = 0.5

# send(part_id, task_id) -> (task id the row now names, whether the broker took it); an empty
# task id means the row no longer names `task_id` (sent by someone else, or no longer queued).
Send = Callable[[int, str], tuple[str, bool]]


class Outbox:
    """Holds (part id → task id the row names) until the part is sent or no longer ours."""

    def __init__(self, send: Send, broker_answers: Callable[[], bool], poll: float = POLL):
        self._send = send
        self._broker_answers = broker_answers
        self.poll = poll
        self._held: dict[int, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, part_id: int, task_id: str) -> None:
        """Send the part again once the broker answers; returns at once."""
        with self._lock:
            self._held[part_id] = task_id
            # A thread inherited through fork() is not alive in the child.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="image-outbox", daemon=True)
                self._thread.start()

    def held(self) -> dict[int, str]:
        """What waits for the broker now (part id → task id)."""
        with self._lock:
            return dict(self._held)

    def _run(self) -> None:
        try:
            while True:
                time.sleep(self.poll)
                if self._broker_answers():
                    self._drain()
                with self._lock:
                    if not self._held:
                        self._thread = None
                        return
        finally:
            connections.close_all()  # this thread's own database connections

    def _drain(self) -> None:
        """Send what is held, oldest first; stop at the first part the broker refuses."""
        for part_id, task_id in self.held().items():
            try:
                now_named, sent = self._send(part_id, task_id)
            except Exception:  # a database error, say: keep the part and try again later
                log.exception("outbox: could not send image part %s again", part_id)
                return
            if sent:
                log.info("image part %s sent again once the broker answered", part_id)
            with self._lock:
                if self._held.get(part_id) == task_id:  # not handed in again meanwhile
                    if sent or not now_named:
                        del self._held[part_id]
                    else:
                        self._held[part_id] = now_named
            if now_named and not sent:
                return
