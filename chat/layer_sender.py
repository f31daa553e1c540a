"""Running channel-layer calls from synchronous code on one long-lived event loop per process.

`async_to_sync` starts a fresh event loop for every call, and channels-redis keeps its Redis
connections per loop, so each event the stream writer sent paid for a new connection: about
25 ms a delta on a busy 2-core machine, against 0.3 ms on a loop that lives on (measured with
bench/stream.py, docs/benchmarks.md). The loop runs in a daemon thread, started on first use
and again in a forked child (a Celery worker), where the parent's thread does not exist.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine

TIMEOUT = 30.0

_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="layer-sender", daemon=True)
            thread.start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def run(coroutine: Coroutine) -> object:
    """Run a coroutine on the sender loop and wait for it; its exceptions propagate.

    A call not done within TIMEOUT is cancelled and raises TimeoutError (an OSError).
    """
    future = asyncio.run_coroutine_threadsafe(coroutine, _running_loop())
    try:
        return future.result(TIMEOUT)
    finally:
        future.cancel()
