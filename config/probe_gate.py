"""Whether a hot path should call a service now: closed after a failure, reopened by a probe.

A loop that calls a service for every text piece, or every request of a process, would
otherwise pay a failed call per piece during an outage, and for PostgreSQL behind psycopg's
pool a wait of the pool's whole timeout (30 s) per call. Once closed, a caller gets False at
once, except one caller every `interval` seconds (doubling from `first_probe` up to
`max_probe`), which runs the probe (a PING, a direct connection); the first probe that
succeeds opens the gate, so work resumes at most `max_probe` seconds after the service is
back, and `on_reopen` runs once then. Used by `config.redis_client.RedisGate` and by the
PostgreSQL backend (`config.postgres`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class ProbeGate:
    """The state of one service for this process, as the callers found it."""

    def __init__(
        self,
        name: str,
        probe: Callable[[], bool],
        on_reopen: Callable[[], None] = lambda: None,
        first_probe: float = 0.1,
        max_probe: float = 1.0,
    ) -> None:
        self.name, self.probe, self.on_reopen = name, probe, on_reopen
        self.first_probe, self.max_probe = first_probe, max_probe
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._interval = first_probe
        self._next_probe = 0.0

    def open(self) -> bool:
        """True when the service is believed up, or when this caller's probe found it back."""
        with self._lock:
            if self._down_since is None:
                return True
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + self._interval
            self._interval = min(self.max_probe, self._interval * 2)
        if not self.probe():
            return False
        with self._lock:
            reopened = self._down_since is not None
            if reopened:
                log.warning("%s answers again after %.1f s", self.name, now - self._down_since)
                self._down_since = None
        if reopened:
            self.on_reopen()
        return True

    def failed(self) -> None:
        """A call failed: close the gate (if open) and probe again soon."""
        with self._lock:
            if self._down_since is not None:
                return
            now = time.monotonic()
            self._down_since = now
            self._interval = self.first_probe
            self._next_probe = now + self.first_probe
        log.warning(
            "%s unreachable: calls skipped, probed every %.1f s at most", self.name, self.max_probe
        )
