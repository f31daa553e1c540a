"""The process's Redis clients for its own keys (live text tails, metrics, heartbeats).

One client, and so one connection pool, per URL and timeout: a client made per call paid for
a new connection every time (14 ms a text piece on a busy machine, against 0.05 ms on a kept
connection). The pool keeps two idle connections open and gives back what a burst of threads
borrowed (`config.resting_pool`); it notices a fork and reconnects in the child (Celery workers).
The URL is read on each call, so a test that points REDIS_URL elsewhere gets a client there.
"""

from __future__ import annotations

import functools

import redis
from django.conf import settings

from config.probe_gate import ProbeGate
from config.resting_pool import RestingPool

KEEP = 2  # the threads that call Redis all the time: the text writer and a request's
MAX_CONNECTIONS = 32


def redis_client(timeout: float = 2.0) -> redis.Redis:
    """A shared client for REDIS_URL whose calls give up after `timeout` seconds."""
    return _client_for(settings.REDIS_URL, timeout)


@functools.cache
def _client_for(url: str, timeout: float) -> redis.Redis:
    pool = RestingPool.from_url(
        url,
        keep=KEEP,
        max_connections=MAX_CONNECTIONS,
        timeout=timeout,  # waiting for a free connection counts against the same budget
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )
    return redis.Redis(connection_pool=pool)


class RedisGate(ProbeGate):
    """Whether a hot path should call Redis now: closed after a failure, probed with a PING
    with a short timeout (`config.probe_gate`)."""

    def __init__(
        self, first_probe: float = 0.1, max_probe: float = 1.0, ping_timeout: float = 0.5
    ) -> None:
        super().__init__("Redis", self.ping, first_probe=first_probe, max_probe=max_probe)
        self.ping_timeout = ping_timeout

    def ping(self) -> bool:
        try:
            return bool(redis_client(self.ping_timeout).ping())
        except (redis.RedisError, OSError):
            return False
