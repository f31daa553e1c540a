"""Live events to this process's sockets and streams: one Redis subscription per conversation.

`chat.events.send` PUBLISHes each event once on the conversation's channel. Here each web
process subscribes once to the channels its readers watch, decodes an event once and hands it
to every local reader, so a thousand readers cost Redis one message per event and process,
not one operation per reader (channels-redis's `group_send` did a sorted-set read and a push
per member, and dropped past 100 waiting).

A reader never blocks the others or the writer: each has its own bounded queue, and a reader
that falls LIMIT events behind, or that was reading when the subscription broke, is dropped
(`Reader.next` returns None, `Reader.lost` says why): its socket or stream then resumes from
a snapshot, so nothing it missed is lost silently.

A reader whose owner can send an event synchronously (`chat.direct`, under Daphne)
sets `Reader.direct`: while the owner's task waits with nothing queued, events go straight
through it as they are delivered, with no task woken per reader and event; whatever it
declines (a delta to mend from the tail, a close) is queued, and so is everything after it
until the task has caught up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import redis
from django.conf import settings
from redis import asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from chat import events, live_text
from config.resting_pool import AsyncRestingPool

log = logging.getLogger(__name__)
LIMIT = 500  # events a reader may have waiting before it is dropped to resume
JOIN_TIMEOUT = 10.0  # seconds for Redis to confirm a subscription


class Delivery:
    """One published event: the JSON as it came, decoded once, and encodings made from it."""

    __slots__ = ("raw", "event", "_encoded")

    def __init__(self, raw: str) -> None:
        self.raw = raw
        self.event: dict = json.loads(raw)
        self._encoded: dict[str, Any] = {}

    def encoded(self, name: str, encode: Callable[[Delivery], Any]) -> Any:
        """`encode(delivery)`, made once per process however many readers send it."""
        found = self._encoded.get(name)
        if found is None:
            found = self._encoded[name] = encode(self)
        return found


class Reader:
    """One socket's or stream's view of a conversation's live events."""

    def __init__(self, hub: Hub, channel: str) -> None:
        self.hub = hub
        self.channel = channel
        self.lost: str | None = None
        # Sends an event at once and says True, or says False to have it queued.
        self.direct: Callable[[Delivery], bool] | None = None
        self._direct_on = False  # the owner's task is idle: `direct` may send
        self._items: deque[Delivery] = deque()
        # The owner's task waiting in `next` (a bare future: an asyncio.Event keeps a deque
        # of its own, and a process holds a thousand readers).
        self._waiter: asyncio.Future | None = None

    def offer(self, delivery: Delivery) -> None:
        if self.lost is not None:
            return
        if self._direct_on:
            try:
                if self.direct(delivery):
                    return
            except Exception as exc:  # noqa: BLE001 - one broken socket must not stop the others
                log.warning("a direct write failed; the reader resumes: %r", exc)
                self.drop(f"a direct write failed: {exc!r}")
                return
            self._direct_on = False  # in order: the task sends the rest until it is idle
        if len(self._items) >= LIMIT:
            self.drop(f"fell {LIMIT} events behind")
            return
        self._items.append(delivery)
        self._wake()

    def drop(self, why: str) -> None:
        """This reader must resume from a snapshot: what it waits for is let go."""
        if self.lost is None:
            self.lost = why
        self._items.clear()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, timeout: float | None = None) -> Delivery | None:
        """The next event, waiting for one; None once the reader was dropped. TimeoutError
        after `timeout` seconds without one (nothing is lost: call again)."""
        while not self._items:
            if self.lost is not None:
                return None
            self._direct_on = self.direct is not None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):  # None: no limit
                    await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def close(self) -> None:
        self.hub.leave(self)


class Hub:
    """This event loop's subscriptions and the readers of each channel."""

    def __init__(self) -> None:
        self._readers: dict[str, set[Reader]] = {}
        self._confirmed: dict[str, asyncio.Future] = {}
        self._pubsub: aioredis.client.PubSub | None = None
        self._client: aioredis.Redis | None = None
        self._task: asyncio.Task | None = None
        # One command at a time: two first subscribes at once would each open a connection,
        # and the one not read would swallow its channel's events.
        self._commands = asyncio.Lock()

    async def join(self, conversation_id: int) -> Reader:
        """A reader of the conversation, subscribed once this returns (so a snapshot taken
        afterwards misses nothing); raises when Redis does not answer."""
        channel = events.channel_name(conversation_id)
        reader = Reader(self, channel)
        self._readers.setdefault(channel, set()).add(reader)
        try:
            confirmed = self._confirmed.get(channel)
            if confirmed is None:
                confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
                async with self._commands:
                    await self._connection().subscribe(channel)
            await asyncio.wait_for(asyncio.shield(confirmed), JOIN_TIMEOUT)
        except (redis.RedisError, OSError) as exc:
            self.leave(reader)
            self._broken(exc)
            raise
        except BaseException:  # a slow confirmation (a loaded machine) fails this join alone
            self.leave(reader)
            raise
        return reader

    def leave(self, reader: Reader) -> None:
        readers = self._readers.get(reader.channel)
        if readers is None or reader not in readers:
            return
        readers.discard(reader)
        if not readers:
            del self._readers[reader.channel]
            asyncio.get_running_loop().create_task(self._unsubscribe(reader.channel))

    async def tail(self, part_id: int, after_seq: int) -> list[str]:
        """A part's pieces after `after_seq` from the live tail (`chat.live_text`)."""
        if self._client is None:
            # A storm of readers resuming at once waits for a few connections and gives back
            # what it borrowed (config.resting_pool), instead of keeping one per reader.
            pool = AsyncRestingPool.from_url(
                settings.REDIS_URL, keep=1, max_connections=8, timeout=2.0, socket_timeout=2.0
            )
            self._client = aioredis.Redis(connection_pool=pool)
        items = await self._client.lrange(live_text.KEY.format(part_id), after_seq, -1)
        return [item.decode() for item in items]

    def _connection(self) -> aioredis.client.PubSub:
        if self._pubsub is None:
            # No retries: a reconnect would resubscribe silently, over events lost meanwhile.
            client = aioredis.Redis.from_url(
                settings.REDIS_URL,
                socket_connect_timeout=2.0,
                socket_timeout=5.0,
                socket_keepalive=True,
                retry=Retry(NoBackoff(), 0),
            )
            self._pubsub = client.pubsub()
            self._task = asyncio.get_running_loop().create_task(self._receive(self._pubsub))
        return self._pubsub

    async def _unsubscribe(self, channel: str) -> None:
        if channel in self._readers or self._pubsub is None:
            return  # a reader came back meanwhile, or the subscription is gone anyway
        self._confirmed.pop(channel, None)
        try:
            async with self._commands:
                if channel not in self._readers and self._pubsub is not None:
                    await self._pubsub.unsubscribe(channel)
        except (redis.RedisError, OSError) as exc:
            self._broken(exc)

    async def _receive(self, pubsub: aioredis.client.PubSub) -> None:
        try:
            while True:
                if pubsub.connection is None:  # nothing subscribed yet
                    await asyncio.sleep(0.01)
                    continue
                message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
                channel = message["channel"].decode()
                if message["type"] == "message":
                    self._deliver(channel, message["data"])
                elif message["type"] == "subscribe":
                    confirmed = self._confirmed.get(channel)
                    if confirmed is not None and not confirmed.done():
                        confirmed.set_result(None)
        except Exception as exc:  # noqa: BLE001 - whatever stops the reading, readers resume
            if pubsub is self._pubsub:
                self._broken(exc)

    def _deliver(self, channel: str, data: bytes) -> None:
        readers = self._readers.get(channel)
        if not readers:
            return
        try:
            delivery = Delivery(data.decode())
        except ValueError:
            log.warning("an undecodable live event on %s was ignored", channel)
            return
        for reader in readers:
            reader.offer(delivery)

    def _broken(self, exc: Exception) -> None:
        """The subscription broke: every reader resumes; the next join reconnects."""
        log.warning("live events subscription lost (%s readers resume): %r", self.readers, exc)
        pubsub, self._pubsub = self._pubsub, None
        for readers in self._readers.values():
            for reader in readers:
                reader.drop("the live events subscription was lost")
        self._readers.clear()
        for confirmed in self._confirmed.values():
            if not confirmed.done():
                confirmed.set_exception(ConnectionError("the subscription was lost"))
                confirmed.exception()  # marked as read: a waiter that timed out never reads it
        self._confirmed.clear()
        if pubsub is not None:
            asyncio.get_running_loop().create_task(pubsub.aclose())

    @property
    def readers(self) -> int:
        return sum(len(readers) for readers in self._readers.values())


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """The running event loop's hub (Daphne runs one loop; each test may run its own)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub()
    return found
