"""Django's PostgreSQL backend with a `ProbeGate` in front of every new connection.

While PostgreSQL is down, psycopg's pool makes every caller wait its whole timeout (30 s) for
a connection that cannot come, and brings connections back on a backoff that doubles to about
the outage's length: a page or a turn would hang half a minute before failing, and the text
writer would stall every stream of its process. Behind the gate, a caller is refused at once
with OperationalError (`config.database_unavailable` answers 503), one caller a second at most
probes with a direct connection, and when one connects a new pool replaces the old one.

settings.py names this package as the ENGINE whenever DATABASE_URL is a PostgreSQL URL.
Pooled connections are asked for in two steps: a short wait, which is all a healthy pool
needs unless it is busy; when that runs out, a direct connection (outside the pool) tells a
busy server, where the caller goes on waiting the pool's timeout, from a down one, which
closes the gate. In a burst (200 turns on a pool of 10) most callers wait past the first step:
they take their turn at one probe at a time, and an answer holds for a second, so a burst adds
one connection a second, not one per caller.
"""

from __future__ import annotations

import threading
import time

from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool, PoolTimeout

from config.probe_gate import ProbeGate

STARVED = 1.0  # seconds a pooled connection is waited for before the server is probed
CONNECT_TIMEOUT = 2  # seconds, for the probe's own connection (libpq's minimum is 2)
ANSWER_HOLDS = 1.0  # seconds a probe's "the server answers" stands for the other callers
TOO_MANY_CONNECTIONS = "53300"  # the server answered, it is only full
GATES: dict[str, ProbeGate] = {}
GATES_LOCK = threading.Lock()


def unavailable() -> PoolTimeout:
    """What a refused caller gets: an OperationalError to Django, like a pool that timed out."""
    return PoolTimeout("PostgreSQL is unavailable; the connection was not attempted.")


class GatedPool:
    """The pool as Django sees it: getconn goes through the gate, the rest to the pool of the
    moment (a new one after an outage, see `DatabaseWrapper.refresh_pool`)."""

    starved_probe = threading.Lock()  # one starved caller probes at a time
    answered_at = float("-inf")  # when a starved caller's probe last found the server up

    def __init__(self, wrapper: DatabaseWrapper) -> None:
        self._wrapper = wrapper

    @property
    def _pool(self) -> ConnectionPool:
        return base.DatabaseWrapper.pool.fget(self._wrapper)

    def __getattr__(self, name: str):
        return getattr(self._pool, name)

    def getconn(self, timeout: float | None = None):
        gate = self._wrapper.gate
        if not gate.open():
            raise unavailable()
        pool = self._pool
        pool.open()
        budget = pool.timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            return pool.getconn(min(STARVED, budget))
        except PoolTimeout:
            if not self.server_answers():
                gate.failed()
                raise
        return pool.getconn(max(0.1, budget - (time.monotonic() - started)))

    def server_answers(self) -> bool:
        """One starved caller at a time probes; an answer stands for ANSWER_HOLDS seconds."""
        with GatedPool.starved_probe:
            if time.monotonic() - GatedPool.answered_at < ANSWER_HOLDS:
                return True
            if not self._wrapper.server_answers():
                return False
            GatedPool.answered_at = time.monotonic()
            return True


class DatabaseWrapper(base.DatabaseWrapper):
    """PostgreSQL that answers at once, with an OperationalError, while the server is down."""

    @property
    def gate(self) -> ProbeGate:
        with GATES_LOCK:
            if self.alias not in GATES:
                GATES[self.alias] = ProbeGate("PostgreSQL", self.server_answers, self.refresh_pool)
            return GATES[self.alias]

    @property
    def pool(self):
        return None if super().pool is None else GatedPool(self)

    def server_answers(self) -> bool:
        """Whether a connection of its own, outside the pool, can be opened now."""
        params = {**self.get_connection_params(), "connect_timeout": CONNECT_TIMEOUT}
        try:
            self.Database.connect(**params).close()
        except self.Database.Error as exc:
            return exc.sqlstate == TOO_MANY_CONNECTIONS
        return True

    def refresh_pool(self) -> None:
        """After an outage, a new pool: the old one would bring its connections back on its
        backoff, which had grown, doubling, to about the outage's length."""
        with GATES_LOCK:
            pool = self._connection_pools.pop(self.alias, None)
        if pool is not None:
            pool.close(timeout=0)

    def get_new_connection(self, conn_params):
        if self.pool is not None:  # the gated pool checks the gate itself
            return super().get_new_connection(conn_params)
        if not self.gate.open():
            raise unavailable()
        try:
            return super().get_new_connection(conn_params)
        except self.Database.OperationalError:
            if not self.server_answers():
                self.gate.failed()
            raise
