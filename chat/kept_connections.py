"""Database work on long-lived threads that keep their connections while they have work.

With CONN_MAX_AGE 0 (Django's default, and the right one under ASGI, whose request threads
come and go) every call made through `database_sync_to_async` opens a connection and closes
it again. A live reader's connect (its user, the conversation's owner, the snapshot) made
three such calls on the one thread Channels shares for the process's sync work: at 500
streaming replies py-spy found 80 % of that thread's busy time opening and closing SQLite
connections (each open registers Django's SQL functions and sets the journal mode, every
step giving up the GIL and waiting to get it back), and readers' handshakes queued past
Daphne's 5 s timeout. `KeptThreads` runs such calls on threads of its own (the readers' is
one), each keeping its connection while calls come and letting it go after `IDLE_CLOSE`
seconds without any; the text writer and saver keep theirs the same way (`reset_connection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import close_old_connections, connection, connections
from django.db.utils import InterfaceError, OperationalError

IDLE_CLOSE = 5.0  # seconds with nothing to do before a thread lets its connection go
# One: a connect's reads are 2 ms of Python and wait mostly for the GIL, which the streaming
# threads hold; four threads for them contended for it more and slowed the stream (at 500
# replies, delay p99 up to 5.4 s against 0.2-0.5 s with one: docs/deploy.md).
READER_THREADS = 1
T = TypeVar("T")
log = logging.getLogger(__name__)


def reset_connection() -> None:
    """After a database error, or when idle: drop this thread's connection if it is broken or
    past CONN_MAX_AGE (the next query opens a new one). Never raises: an exception here once
    ended the text writer's thread, and with it every reply's text in the process."""
    try:
        close_old_connections()
    except Exception as exc:  # the database's fault is handled where a query needs it
        log.warning("could not let a kept database connection go: %s", exc)


def call_kept(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` on this thread's kept connection. A kept connection can have died
    while it waited (the database restarted): then the call is made once more on a new one,
    so a restart costs no reader its connect; a second failure is the database's answer."""
    reused = connection.connection is not None
    try:
        return function(*args)
    except (OperationalError, InterfaceError):
        reset_connection()
        if not reused:
            raise
        log.info("a kept database connection had gone; %s tried on a new one", function.__name__)
        try:
            return function(*args)
        except (OperationalError, InterfaceError):
            reset_connection()
            raise


class KeptThreads:
    """`size` daemon threads, started with the first call, that run sync database work for
    the event loop and keep their connections between calls (`call_kept`)."""

    def __init__(self, name: str, size: int = READER_THREADS, idle_close: float = IDLE_CLOSE):
        self.name = name
        self.size = size
        self.idle_close = idle_close
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on one of the threads, with the caller's context variables."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._start()
        self._calls.put((contextvars.copy_context(), function, args, loop, future))
        return await future

    def make_async(self, function: Callable[..., T]) -> Callable[..., Any]:
        """`function` as a coroutine function that runs it on these threads."""

        @functools.wraps(function)
        async def run(*args: Any) -> T:
            return await self.run(function, *args)

        return run

    def release(self, timeout: float = 10.0) -> None:
        """Let every thread's connection go now, once each is done with its call (before a
        test database is dropped: PostgreSQL refuses while connections to it are open)."""
        with self._lock:
            count = len(self._threads)
        if not count:
            return
        barrier = threading.Barrier(count + 1)
        for _ in range(count):  # each thread takes one and waits for the others at it
            self._calls.put(barrier)
        barrier.wait(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._threads:
                return
            self._threads = [
                threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
                for i in range(self.size)
            ]
            for thread in self._threads:
                thread.start()

    def _work(self) -> None:
        idle = False
        while True:
            try:
                call = self._calls.get(timeout=None if idle else self.idle_close)
            except queue.Empty:  # nothing to do for a while: the connection goes
                reset_connection()
                idle = True
                continue
            if isinstance(call, threading.Barrier):  # `release`
                try:
                    connections.close_all()
                except Exception as exc:  # a broken connection is gone either way
                    log.warning("could not close a kept database connection: %s", exc)
                call.wait()
                idle = True
                continue
            idle = False
            context, function, args, loop, future = call
            try:
                outcome, failed = context.run(call_kept, function, *args), False
            except BaseException as exc:  # handed to the caller, whatever it is
                outcome, failed = exc, True
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
                loop.call_soon_threadsafe(settle, future, outcome, failed)


def settle(future: asyncio.Future, outcome: Any, failed: bool) -> None:
    """Hand a call's result or exception to its caller, unless the caller has given up."""
    if future.done():
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


readers = KeptThreads("reader-db")
