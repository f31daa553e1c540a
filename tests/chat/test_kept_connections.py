"""The readers' kept threads: one connection kept across calls, let go when idle or on
`release`, a dead kept connection tried once more on a new one, and errors handed back.

The threads and the database are real; the dead connection is an injected OperationalError
(a PostgreSQL restarted under a kept connection cannot be caused on the test database)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading

import pytest
from django.db import OperationalError, connection

from chat.kept_connections import KeptThreads
from chat.models import Conversation

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
caller = contextvars.ContextVar("caller", default="nobody")


def connection_id() -> int | None:
    """The identity of this thread's open connection, after a query that needs one."""
    Conversation.objects.exists()
    return id(connection.connection)


def is_open() -> bool:
    return connection.connection is not None


@pytest.fixture
def kept():
    """A factory of KeptThreads whose connections go before the test database does."""
    made: list[KeptThreads] = []

    def make(name: str, size: int = 1, idle_close: float = 60.0) -> KeptThreads:
        made.append(KeptThreads(name, size=size, idle_close=idle_close))
        return made[-1]

    yield make
    for threads in made:
        threads.release()


async def test_a_thread_keeps_its_connection_between_calls_and_lets_it_go_when_idle(kept):
    threads = kept("test-kept", size=1, idle_close=0.3)
    first = await threads.run(connection_id)
    assert await threads.run(connection_id) == first  # kept, not opened again
    await asyncio.sleep(1.0)
    assert not await threads.run(is_open)


async def on_each_thread(threads: KeptThreads, function) -> list:
    """`function` once on each of two threads: each call holds its thread until both run."""
    both = threading.Barrier(2)

    def held():
        both.wait(5)
        return function()

    return await asyncio.gather(threads.run(held), threads.run(held))


async def test_release_lets_every_thread_go_at_once(kept):
    threads = kept("test-release", size=2, idle_close=60)
    assert all(await on_each_thread(threads, connection_id))
    assert await on_each_thread(threads, is_open) == [True, True]
    threads.release()
    assert await on_each_thread(threads, is_open) == [False, False]


async def test_a_dead_kept_connection_is_tried_once_more_on_a_new_one(kept, caplog):
    threads = kept("test-retry", size=1, idle_close=60)
    await threads.run(connection_id)
    calls = []

    def dies_once() -> int | None:
        calls.append(is_open())
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return connection_id()

    with caplog.at_level(logging.INFO, logger="chat.kept_connections"):
        assert await threads.run(dies_once) is not None
    assert calls == [True, False]  # the kept one failed; the second try opened a new one
    assert "a kept database connection had gone" in caplog.text


async def test_a_fresh_connection_that_fails_is_the_database_s_answer(kept):
    threads = kept("test-fresh", size=1, idle_close=60)
    threads.release()
    calls = []

    def refused() -> None:
        calls.append(is_open())
        raise OperationalError("connection refused")

    with pytest.raises(OperationalError):
        await threads.run(refused)
    assert calls == [False]  # not retried: nothing kept had died


async def test_errors_and_context_reach_the_caller(kept):
    threads = kept("test-context", size=1)
    caller.set("alice")
    assert await threads.run(caller.get) == "alice"
    with pytest.raises(ZeroDivisionError):
        await threads.run(lambda: 1 / 0)
