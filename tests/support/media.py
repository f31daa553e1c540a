"""Real processes and observers for the media tests: Celery workers, a private Redis, and a
listener on a conversation's live events channel (what a browser socket would receive)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
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
    """Receives a conversation's live events in a thread, as a web process does for its
    sockets: subscribed to the conversation's pub/sub channel (`chat.events`)."""

    def __init__(self, conversation_id: int, redis_url: str | None = None) -> None:
        from chat.events import channel_name

        self._redis = redis.Redis.from_url(redis_url or settings.REDIS_URL, socket_timeout=30)
        database = self._redis.connection_pool.connection_kwargs.get("db", 0)
        self.channel = channel_name(conversation_id, database)
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._pubsub = self._redis.pubsub()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def __enter__(self) -> EventTap:
        self._pubsub.subscribe(self.channel)
        confirmed = self._pubsub.get_message(timeout=10)
        assert confirmed and confirmed["type"] == "subscribe", "the event tap did not subscribe"
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(10)
        self._pubsub.close()
        self._redis.close()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(timeout=0.1)
            except (redis.RedisError, OSError):
                # A test that stops its Redis: listen again once it is back, as a page does.
                self._stop.wait(0.2)
                continue
            if message is not None and message["type"] == "message":
                self.events.append(json.loads(message["data"]))

    def settle(self, timeout: float = 10) -> list[dict]:
        """Wait until every event sent before now has arrived, then return them all.

        A marker goes through the same channel; Redis delivers in order, so once the marker
        is here, so is everything sent before it.
        """
        marker = uuid.uuid4().hex
        self._redis.publish(self.channel, json.dumps({"type": "tap.marker", "marker": marker}))
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
