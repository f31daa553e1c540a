"""Redis connection pools that give back what a burst borrowed.

redis-py's pools keep every connection they ever opened: the one moment when five threads (or
coroutines) call Redis at once leaves five sockets open for the rest of the process's life,
in the process and in Redis, and a reconnect storm of a thousand readers could open a
thousand. These pools wait at `max_connections` instead of opening more, and keep only the
`keep` most recently used idle connections open: when a connection comes back, the sockets of
the others that have rested `rest` seconds are closed (the connection objects stay, and
reconnect when a later burst needs them; a burst itself reuses its connections). SQLAlchemy's
pool_size and max_overflow, for Redis.
"""

from __future__ import annotations

import time

import redis
import redis.asyncio


class Resting:
    """When each connection last came back, and which idle ones to close."""

    def __init__(self, keep: int, rest: float) -> None:
        self.keep, self.rest = keep, rest
        self.released_at: dict[object, float] = {}

    def came_back(self, connection: object) -> None:
        self.released_at[connection] = time.monotonic()

    def surplus(self, idle: list) -> list:
        """Of the idle connections (the list ends with the one used last), those beyond the
        `keep` used last that have rested long enough."""
        connected = [conn for conn in idle if conn is not None and conn.is_connected]
        now = time.monotonic()
        return [
            conn
            for conn in connected[: max(len(connected) - self.keep, 0)]
            if now - self.released_at.get(conn, now) >= self.rest
        ]


class RestingPool(redis.BlockingConnectionPool):
    """A thread-safe pool (`redis.Redis(connection_pool=...)`) that closes rested surplus."""

    def __init__(self, keep: int = 1, rest: float = 5.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.resting = Resting(keep, rest)

    def release(self, connection: redis.Connection) -> None:
        self.resting.came_back(connection)
        super().release(connection)
        # Under the queue's lock, so no thread takes a connection while its socket closes.
        with self.pool.mutex:
            for conn in self.resting.surplus(list(self.pool.queue)):
                conn.disconnect()


class AsyncRestingPool(redis.asyncio.BlockingConnectionPool):
    """The same for one event loop (`redis.asyncio.Redis(connection_pool=...)`)."""

    def __init__(self, keep: int = 1, rest: float = 5.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.resting = Resting(keep, rest)

    async def release(self, connection: redis.asyncio.Connection) -> None:
        self.resting.came_back(connection)
        await super().release(connection)
        # Holding the condition that get_connection() waits on: no one takes these meanwhile.
        async with self._condition:
            for conn in self.resting.surplus(self._available_connections):
                await conn.disconnect()
