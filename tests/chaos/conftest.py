"""Chaos scenarios: each starts its own redis-server, web, worker and beat processes, causes one
fault for real, and writes what it measured to var/reliability/<scenario>.json.

The figures are the point (docs/reliability.md quotes them): every scenario also prints a
one-line summary at the end of the run and asserts its figures against the bounds it states.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.utils import load_backend
from django.test import Client

from chat.models import UNFINISHED_STATES, Conversation, Part
from chat.states import TERMINAL
from tests.support.http import post_json
from tests.support.media import RedisServer, new_redis_server
from tests.support.postgres import PostgresCluster
from tests.support.processes import ROOT, child_env, wait_until

SUMMARIES: list[str] = []
# The chaos web servers run the model on one thread. On a machine shared with other work, a
# second OpenMP thread that loses its core stalls every op at a barrier (steps of 30 s were
# seen on a busy 2-core machine); these scenarios measure fault handling, not speed.
SERVER_ENV = {"OMP_NUM_THREADS": "1"}
# The marks of a scenario that runs the model and watches a page in Chromium.
BROWSER_SCENARIO = [
    pytest.mark.chaos,
    pytest.mark.model,
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


def record_figures(scenario: str, summary: str, **figures) -> dict:
    """Write the scenario's figures as JSON and queue its summary line for the run's end."""
    folder = settings.VAR_DIR / "reliability"
    folder.mkdir(parents=True, exist_ok=True)
    payload = {"scenario": scenario, "finished_at": datetime.now(UTC).isoformat(), **figures}
    (folder / f"{scenario}.json").write_text(json.dumps(payload, indent=2) + "\n")
    SUMMARIES.append(f"{scenario}: {summary}")
    return payload


def pytest_terminal_summary(terminalreporter) -> None:
    if SUMMARIES:
        terminalreporter.section("chaos figures (var/reliability/*.json)")
        for line in SUMMARIES:
            terminalreporter.write_line(line)


@dataclass
class Visitor:
    """A signed-in user of a server, with the cookies the page's own fetch calls send."""

    user: object
    session: str
    csrf: str

    @property
    def cookies(self) -> dict[str, str]:
        return {settings.SESSION_COOKIE_NAME: self.session, settings.CSRF_COOKIE_NAME: self.csrf}

    def conversation(self) -> Conversation:
        return Conversation.objects.create(owner=self.user)

    @property
    def cookie_header(self) -> str:
        return "; ".join(f"{name}={value}" for name, value in self.cookies.items())

    def post_turn(self, server, conversation: Conversation, text: str, image: bool = False):
        """POST a turn as the composer does; returns (status, headers, body)."""
        headers = {"Cookie": self.cookie_header, "X-CSRFToken": self.csrf}
        body = {"text": text, "image": image}
        return post_json(f"{server.url}/c/{conversation.pk}/turns", body, headers, timeout=60)

    def browser_cookies(self, server) -> list[dict]:
        return [{"name": n, "value": v, "url": server.url} for n, v in self.cookies.items()]


def make_visitor(prefix: str = "chaos") -> Visitor:
    """A user signed in without a password (no hashing cost: scenarios make dozens)."""
    user = get_user_model().objects.create_user(f"{prefix}-{uuid.uuid4().hex[:8]}")
    client = Client()
    client.force_login(user)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    return Visitor(user, session, secrets.token_hex(16))  # an unmasked 32-character secret


@pytest.fixture
def private_redis(service_logs) -> Iterator[RedisServer]:
    """A redis-server of this scenario's own, free to be stopped."""
    server = new_redis_server(service_logs).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_postgres() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster of this scenario's own, migrated, free to be stopped; this process's
    ORM is pointed at it for the test (the servers are given its URL as DATABASE_URL)."""
    import dj_database_url

    cluster = PostgresCluster().init().start()
    original = connections["default"]
    try:
        cluster.create_database("tandem")
        url = cluster.url("tandem")
        migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
        subprocess.run(migrate, cwd=ROOT, env=child_env(DATABASE_URL=url), check=True, timeout=300)
        config = connections.configure_settings({"default": dj_database_url.parse(url)})
        backend = load_backend(config["default"]["ENGINE"])
        connections["default"] = backend.DatabaseWrapper(config["default"], "default")
        yield cluster
    finally:
        connections["default"].close()
        connections["default"] = original
        cluster.remove()


def outage_env(redis: RedisServer, tmp_path: Path) -> dict[str, str]:
    """The servers' environment in a PostgreSQL outage scenario (their DATABASE_URL is the
    private cluster's: see `private_postgres`)."""
    media = str(tmp_path / "media")
    return {"REDIS_URL": redis.url, "MEDIA_ROOT": media, "TANDEM_SWEEP_INTERVAL": "1"}


def unfinished(part_ids: list[int]) -> list[int]:
    return list(
        Part.objects.filter(pk__in=part_ids, state__in=UNFINISHED_STATES).values_list(
            "pk", flat=True
        )
    )


def wait_terminal(part_ids: list[int], timeout: float, what: str) -> float:
    """Wait until every part is final; returns the seconds it took."""
    started = time.monotonic()
    wait_until(lambda: not unfinished(part_ids), timeout, what, interval=0.2)
    return time.monotonic() - started


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds()


FINAL = set(TERMINAL)
