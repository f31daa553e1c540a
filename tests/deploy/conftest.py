"""The topology test's stack: hosts on a real network (tests/support/network.py), each running
its own Tandem process, with redis-server and PostgreSQL of the test's own on the bridge.

Module-scoped, so the scenarios share one network, one Redis, one PostgreSQL and the worker
host; each scenario starts the web processes it kills. Everything is stopped by pid and the
namespaces, veths and bridge are removed in the fixtures' finalizers, on failure too.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from django.db import connections
from django.db.utils import load_backend

from tests.support.media import RedisServer, start_worker
from tests.support.network import Host, Topology
from tests.support.postgres import PostgresCluster
from tests.support.processes import (
    BIN,
    ROOT,
    Service,
    child_env,
    free_port,
    wait_until,
)

HOST_NAMES = ["web-a", "web-b", "worker", "engine"]
HEARTBEAT_TTL = 3  # seconds: a killed web process's parts are interrupted a few seconds later
SUMMARIES: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    if SUMMARIES:
        terminalreporter.section("topology (tests/deploy)")
        for line in SUMMARIES:
            terminalreporter.write_line(line)


@dataclass
class WebHost:
    """A Daphne serving Tandem on one host's own address."""

    host: Host
    port: int
    service: Service

    @property
    def url(self) -> str:
        return f"http://{self.host.address}:{self.port}"

    def ready(self) -> bool:
        """/health answers 200 (raises when the process has exited)."""
        assert self.service.alive(), self.service.log_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False


@dataclass
class Stack:
    """The network and the services every host shares."""

    topology: Topology
    redis: RedisServer
    postgres: PostgresCluster
    logs: Path

    @property
    def env(self) -> dict[str, str]:
        """What every Tandem process on the topology is given."""
        return {
            "REDIS_URL": self.redis.url,
            "DATABASE_URL": self.postgres.url("tandem"),
            "ALLOWED_HOSTS": ",".join(h.address for h in self.topology.hosts.values()),
            "TANDEM_HEARTBEAT_TTL": str(HEARTBEAT_TTL),
            "TANDEM_SWEEP_INTERVAL": "1",
            "OMP_NUM_THREADS": "1",
        }

    def host(self, name: str) -> Host:
        return self.topology.hosts[name]

    def start_web(self, host: str, name: str, port: int | None = None, **env: str) -> WebHost:
        """Start Daphne on `host`'s address (`port` again is a restart); return once its
        /health says ready."""
        on = self.host(host)
        port = port or on.port()
        endpoint = f"tcp:port={port}:interface={on.address}:backlog=1024"
        argv = on.command([str(BIN / "daphne"), "-e", endpoint, "config.asgi:application"])
        service = Service(name, argv, child_env(**{**self.env, **env}), self.logs)
        web = WebHost(on, port, service)
        try:
            wait_until(web.ready, 120, f"{name} on {on.address} to be ready", interval=0.25)
        except BaseException:
            service.stop()
            raise
        return web


def synthetic(tokens: int, tokens_per_s: float = 20) -> dict[str, str]:
    """Web settings for the synthetic engine source: `tokens` per reply at a known pace."""
    return {
        "TANDEM_ENGINE_SOURCE": "synthetic",
        "TANDEM_SYNTHETIC_TOKENS_PER_S": str(tokens_per_s),
        "TANDEM_CHAT_MAX_NEW_TOKENS": str(tokens),
    }


def migrate(database_url: str) -> None:
    argv = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
    env = child_env(DATABASE_URL=database_url)
    subprocess.run(argv, cwd=ROOT, env=env, check=True, timeout=300)


def side_by_side(*starts: Callable[[], object]) -> list:
    """Run the starts in parallel and return their results; when one fails, stop the
    processes the others started (by pid) and raise its error."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(start) for start in starts]
    errors = [future.exception() for future in futures if future.exception() is not None]
    if errors:
        for future in futures:
            service = getattr(future.exception() or future.result(), "service", None)
            if isinstance(service, Service):
                service.stop()
        raise errors[0]
    return [future.result() for future in futures]


@pytest.fixture(scope="module")
def topology() -> Iterator[Topology]:
    """The hosts, on namespaces or (where they cannot be made) on loopback addresses."""
    made = Topology()
    try:
        made.make(HOST_NAMES)
        SUMMARIES.append(made.describe())
        print(f"\ntopology: {made.describe()}")
        yield made
    finally:
        made.remove()
    left = made.leftovers()
    assert not left, f"the topology left {left} behind"


@pytest.fixture(scope="module")
def stack(topology, tmp_path_factory) -> Iterator[Stack]:
    """redis-server and PostgreSQL listening on the bridge's address (`hosts` migrates it)."""
    logs = tmp_path_factory.mktemp("topology-logs")
    address = topology.service_address
    redis = RedisServer(free_port(), logs, host=address).start()
    postgres = PostgresCluster(host=address, clients=topology.clients)
    try:
        postgres.init().start()
        postgres.create_database("tandem")
        yield Stack(topology, redis, postgres, logs)
    finally:
        postgres.remove()
        redis.stop()


@pytest.fixture
def orm_on_stack(stack, django_db_blocker) -> Iterator[None]:
    """Point this process's ORM at the hosts' database for one test.

    Per test, not per module: Django keeps connections per context, and a scenario's body
    does not see a connection a module-scoped fixture set. pytest-django's own test database
    is not used (no django_db mark): every scenario makes users and conversations of its own.
    """
    import dj_database_url

    original = connections["default"]
    config = connections.configure_settings(
        {"default": dj_database_url.parse(stack.postgres.url("tandem"))}
    )
    backend = load_backend(config["default"]["ENGINE"])
    connections["default"] = backend.DatabaseWrapper(config["default"], "default")
    try:
        with django_db_blocker.unblock():
            yield
    finally:
        connections["default"].close()
        connections["default"] = original


@dataclass
class Hosts:
    """The processes that outlive a scenario: the worker host (Celery with beat, so the
    sweeper every second) and web host B (synthetic tokens), which survives A's kill."""

    worker: Service
    web_b: WebHost


@pytest.fixture(scope="module")
def hosts(stack) -> Iterator[Hosts]:
    """The worker host and web host B, started side by side with the database's migration
    (a process's start is mostly imports; the sweeper's first beats may miss the tables)."""
    worker, web_b, _ = side_by_side(
        partial(
            start_worker,
            stack.logs,
            beat_schedule=stack.logs / "beat-schedule",
            launcher=stack.host("worker").command,
            **stack.env,
        ),
        partial(stack.start_web, "web-b", "daphne-web-b", **synthetic(tokens=160)),
        partial(migrate, stack.postgres.url("tandem")),
    )
    try:
        yield Hosts(worker.service, web_b)
    finally:
        web_b.service.stop()
        worker.service.kill()  # a warm shutdown waits for beat; nothing here needs one
        worker.service.stop()


@pytest.fixture
def web_b(hosts) -> WebHost:
    return hosts.web_b


@pytest.fixture
def started(stack) -> Iterator[Callable[..., WebHost]]:
    """Start Daphnes on hosts for one scenario (Stack.start_web); all stopped at its end."""
    servers: list[WebHost] = []

    def start(host: str, name: str, port: int | None = None, **env: str) -> WebHost:
        server = stack.start_web(host, name, port, **env)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.service.stop()


@pytest.fixture
def web_a(stack, hosts) -> Iterator[WebHost]:
    """Web host A, synthetic tokens, fresh for each scenario (some kill it)."""
    web = stack.start_web("web-a", "daphne-web-a", **synthetic(tokens=160))
    try:
        yield web
    finally:
        web.service.stop()
