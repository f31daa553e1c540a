"""Liveness of the web processes that stream text parts.

Each web process has an owner id and refreshes a Redis key with a TTL while it runs; a text
part records the owner streaming it. When the key is gone, that process stopped (crashed,
restarted, killed), so the sweeper marks its unfinished text parts `interrupted`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid

import redis
from django.conf import settings

from config.redis_client import redis_client

KEY_PREFIX = "tandem:web-heartbeat:"
OWNER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def beat(owner: str = OWNER) -> None:
    """Say this process is alive for the next TANDEM_HEARTBEAT_TTL seconds."""
    client = redis_client(settings.TANDEM_HEALTH_TIMEOUT)
    client.set(KEY_PREFIX + owner, "1", ex=settings.TANDEM_HEARTBEAT_TTL)


def is_alive(owner: str) -> bool:
    """Whether the process `owner` has beaten within its TTL."""
    return bool(redis_client(settings.TANDEM_HEALTH_TIMEOUT).exists(KEY_PREFIX + owner))


def start() -> None:
    """Beat from a daemon thread every third of the TTL; a Redis outage only skips beats."""

    def run() -> None:
        while True:
            with contextlib.suppress(redis.RedisError):
                beat()
            time.sleep(settings.TANDEM_HEARTBEAT_TTL / 3)

    threading.Thread(target=run, name="web-heartbeat", daemon=True).start()
