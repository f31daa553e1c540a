"""Real processes and observers for the media tests: Celery workers, a private Redis, and a
listener on a conversation's channel-layer group (what a browser socket would receive)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from tests.support.database import test_database_url
from tests.support.processes import BIN, Service, child_env, free_port, port_open, wait_until


@dataclass
class Worker:
    """A running `celery worker` on the media queue."""

    service: Service
    name: str

    def log_count(self, text: str) -> int:
        return self.service.log_text().count(text)


def start_worker(
    log_dir: Path,
    *,
    concurrency: int = 1,
    beat_schedule: Path | None = None,
    launcher: Callable[[list[str]], list[str]] = list,
    **env: str,
) -> Worker:
    """Start a worker against the test database (and `env`, e.g. REDIS_URL); wait until ready.

    `beat_schedule` also runs celery beat inside it (-B), with its schedule file there;
    `launcher` wraps the command line (a topology host's `command` runs it in a namespace).
    """
    name = f"media-{uuid.uuid4().hex[:8]}@localhost"
    argv = [
        str(BIN / "celery"),
        "-A",
        "config",
        "worker",
        "-Q",
        "media",
        "-c",
        str(concurrency),
        "-n",
        name,
        "--without-gossip",
        "--without-mingle",
        "-l",
        "info",
    ]
    if beat_schedule is not None:
        argv += ["-B", "-s", str(beat_schedule)]
    environment = child_env(**{"DATABASE_URL": test_database_url(), **env})
    service = Service(f"worker-{name.split('@')[0]}", launcher(argv), environment, log_dir)
    try:
        wait_until(
            lambda: not service.alive() or f"{name} ready." in service.log_text(),
            90,
            "the celery worker to be ready",
        )
    except TimeoutError:
        service.stop()
        raise
    assert service.alive(), service.log_text()
    return Worker(service, name)


@dataclass
class RedisServer:
    """A private redis-server, so a test can stop its broker without touching the shared one."""

    port: int
    log_dir: Path
    service: Service | None = None
    host: str = "127.0.0.1"  # another address (a bridge's) lets other network namespaces in

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> RedisServer:
        argv = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--protected-mode",
            "no" if self.host != "127.0.0.1" else "yes",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.log_dir),
        ]
        self.service = Service(f"redis-{self.port}", argv, child_env(), self.log_dir)
        wait_until(lambda: port_open(self.port, self.host), 20, f"redis-server on port {self.port}")
        return self

    def stop(self) -> None:
        """Stop it by its pid; with no persistence, its queues are lost as in a crash."""
        if self.service is not None:
            self.service.stop()
            self.service = None


def new_redis_server(log_dir: Path) -> RedisServer:
    return RedisServer(free_port(), log_dir)


def media_queue(url: str) -> list[str]:
    """Ids of the tasks waiting in a broker's media queue."""
    with redis.Redis.from_url(url) as client:
        return [json.loads(raw)["headers"]["id"] for raw in client.lrange("media", 0, -1)]


@contextmanager
def celery_broker(url: str) -> Iterator[None]:
    """Point this process's Celery app at another broker, as a web process configured so."""
    from config.celery import app

    previous = app.conf.broker_url
    app.conf.broker_url = url
    app._after_fork()  # Celery's own reset: drops pooled connections to the old broker
    try:
        yield
    finally:
        app.conf.broker_url = previous
        app._after_fork()


class EventTap:
    """Receives a conversation's channel-layer events in a thread, as a browser socket does."""

    def __init__(self, conversation_id: int, redis_url: str | None = None) -> None:
        self.group = f"conversation.{conversation_id}"
        self.redis_url = redis_url or settings.REDIS_URL
        self.events: list[dict] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._listen(),), daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._layer: RedisChannelLayer | None = None

    def __enter__(self) -> EventTap:
        self._thread.start()
        assert self._ready.wait(10), "the event tap did not join its group"
        return self

    def __exit__(self, *exc_info) -> None:
        self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)

    async def _listen(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        # redis-py's default 5 s read timeout would cut the layer's 5 s blocking pops short.
        host = {"address": self.redis_url, "socket_timeout": 30}
        self._layer = RedisChannelLayer(hosts=[host], prefix=prefix)
        channel = await self._layer.new_channel()
        await self._layer.group_add(self.group, channel)
        self._ready.set()
        try:
            while True:
                self.events.append(await self._layer.receive(channel))
        except asyncio.CancelledError:
            pass
        finally:
            await self._layer.close_pools()

    def settle(self, timeout: float = 10) -> list[dict]:
        """Wait until every event sent before now has arrived, then return them all.

        A marker goes through the same group; the layer delivers in order, so once the
        marker is here, so is everything sent before it.
        """
        marker = uuid.uuid4().hex
        send = self._layer.group_send(self.group, {"type": "tap.marker", "marker": marker})
        asyncio.run_coroutine_threadsafe(send, self._loop).result(timeout)
        wait_until(
            lambda: any(event.get("marker") == marker for event in self.events),
            timeout,
            "the event tap's marker",
        )
        return [event for event in self.events if event["type"] != "tap.marker"]

    def part_states(self, part_id: int) -> list[dict]:
        """The `part.state` payloads of one part, in order of arrival."""
        return [
            event["part"]
            for event in self.settle()
            if event["type"] == "part.state" and event["part"]["id"] == part_id
        ]
