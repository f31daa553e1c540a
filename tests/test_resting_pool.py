"""Redis pools that give back what a burst borrowed (`config.resting_pool`), counted by the
real Redis server (CLIENT LIST by the pool's client name)."""

import asyncio
import threading
import uuid

import pytest
import redis
import redis.asyncio
from django.conf import settings

from config.resting_pool import AsyncRestingPool, RestingPool


def server_connections(name: str) -> int:
    with redis.Redis.from_url(settings.REDIS_URL) as admin:
        return sum(1 for client in admin.client_list() if client["name"] == name)


def sync_pool(**kwargs) -> tuple[RestingPool, str]:
    name = f"resting-{uuid.uuid4().hex[:8]}"
    kwargs.setdefault("max_connections", 16)
    return RestingPool.from_url(settings.REDIS_URL, client_name=name, **kwargs), name


def burst(pool: RestingPool, size: int) -> None:
    """`size` connections in use at once, each answering a PING, then given back."""
    held = [pool.get_connection() for _ in range(size)]
    for connection in held:
        connection.send_command("PING")
        assert connection.read_response() in (b"PONG", "PONG")
    for connection in held:
        pool.release(connection)


def test_a_burst_gives_back_all_but_keep_once_rested():
    pool, name = sync_pool(keep=2, rest=0.0)
    try:
        burst(pool, 6)
        assert server_connections(name) == 2
        burst(pool, 5)  # the closed ones reconnect when a burst needs them
        assert server_connections(name) == 2
    finally:
        pool.disconnect()


def test_connections_used_lately_stay_open():
    pool, name = sync_pool(keep=1, rest=60.0)
    try:
        burst(pool, 4)
        assert server_connections(name) == 4  # a burst going on reuses, never reconnects
    finally:
        pool.disconnect()


def test_threads_calling_at_once_share_a_bounded_pool():
    pool, name = sync_pool(keep=1, rest=0.0, max_connections=3, timeout=5)
    client = redis.Redis(connection_pool=pool)
    start, errors = threading.Barrier(12), []

    def call() -> None:
        start.wait()
        try:
            for _ in range(50):
                client.blpop(["resting-nothing"], timeout=0.01)
        except redis.RedisError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(12)]
    try:
        for thread in threads:
            thread.start()
        peak = 0
        while any(thread.is_alive() for thread in threads):
            peak = max(peak, server_connections(name))
        for thread in threads:
            thread.join()
        assert not errors
        assert 1 <= peak <= 3
        client.ping()
        assert server_connections(name) == 1
    finally:
        pool.disconnect()


def test_past_max_connections_a_caller_waits_then_gives_up():
    pool, _ = sync_pool(max_connections=2, timeout=0.2)
    held = [pool.get_connection() for _ in range(2)]
    try:
        with pytest.raises(redis.ConnectionError, match="No connection available"):
            pool.get_connection()
    finally:
        for connection in held:
            pool.release(connection)
        pool.disconnect()


def test_the_event_loop_pool_gives_back_a_storm():
    name = f"resting-{uuid.uuid4().hex[:8]}"

    async def storm() -> tuple[int, int, int]:
        pool = AsyncRestingPool.from_url(
            settings.REDIS_URL, client_name=name, keep=1, rest=0.0, max_connections=4, timeout=5
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, await asyncio.to_thread(server_connections, name))
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(
            *(client.blpop(["resting-nothing"], timeout=0.05) for _ in range(40))
        )
        watcher.cancel()
        await client.ping()
        after = await asyncio.to_thread(server_connections, name)
        await pool.disconnect()
        return peak, after, len(results)

    peak, after, answered = asyncio.run(storm())
    assert answered == 40
    assert 1 <= peak <= 4
    assert after == 1
