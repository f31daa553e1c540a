"""The streaming bench's server side: its own database, users, Daphnes, turns and memory reads.

The bench runs Django itself only to prepare its SQLite database (var/bench/) with users,
sessions and conversations; every turn is started over HTTP, inside the Daphne it launched
on a free port, exactly as a browser starts one. Daphne is stopped by its own pid.
"""

from __future__ import annotations

import http.client
import json
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.support.processes import BIN, ROOT, Service, child_env, free_port, port_open, wait_until

BENCH_DIR = ROOT / "var" / "bench"
PROMPT = "Tell me a long story about a lighthouse keeper and a storm, in many paragraphs."


@dataclass(frozen=True)
class Viewer:
    """A signed-in user and the conversation they watch; the cookie is what a browser sends."""

    username: str
    conversation_id: int
    cookie: str
    csrf: str


def migrate() -> None:
    """Migrate the bench's fresh database (Django must already be set up on it)."""
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def create_viewers(label: str, conversations: int) -> list[Viewer]:
    """One new user, session and empty conversation per watched conversation."""
    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore

    from chat.models import Conversation

    viewers = []
    for index in range(conversations):
        user = get_user_model().objects.create_user(f"{label}-{index}")
        conversation = Conversation.objects.create(owner=user, title=f"bench {index}")
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        # The backend that loads users; the first one (django-axes) only vets logins.
        session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[-1]
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.save()
        csrf = secrets.token_hex(16)  # a 32-character secret, as Django's cookie holds
        cookie = f"{settings.SESSION_COOKIE_NAME}={session.session_key}; csrftoken={csrf}"
        viewers.append(Viewer(user.username, conversation.pk, cookie, csrf))
    return viewers


class BenchServer:
    """One Daphne serving config.asgi on the bench database, with the given settings."""

    def __init__(self, database: Path, log_dir: Path, **env: str) -> None:
        self.port = free_port()
        argv = [
            str(BIN / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(self.port),
            "config.asgi:application",
        ]
        environment = child_env(DATABASE_URL=f"sqlite:///{database}", **env)
        self.service = Service(f"daphne-{self.port}", argv, environment, log_dir)
        self.process = psutil.Process(self.service.pid)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300) -> None:
        """Until /health says the engine is ready (synthetic: seconds; the model: longer), or
        that the text comes from remote engines."""
        wait_until(lambda: port_open(self.port) or not self.service.alive(), 60, "daphne")

        def ready() -> bool:
            if not self.service.alive():
                raise RuntimeError(f"daphne exited:\n{self.service.log_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.origin}/health", timeout=5) as response:
                    return json.load(response)["model"]["state"] in ("ready", "remote")
            except urllib.error.HTTPError as exc:
                model = json.loads(exc.read() or b"{}").get("model", {})
                if model.get("state") == "error":  # it will not become ready: say why now
                    raise RuntimeError(f"the engine failed to start: {model}") from exc
                return False

        wait_until(ready, timeout, "the engine to be ready", interval=0.25)

    def rss(self) -> int:
        """Daphne's resident memory in bytes."""
        return self.process.memory_info().rss

    def cpu_seconds(self) -> float:
        """Daphne's user + system CPU time so far."""
        times = self.process.cpu_times()
        return times.user + times.system

    def post(self, viewer: Viewer, path: str, body: dict | None = None) -> tuple[int, dict]:
        """A signed-in POST with the CSRF header, as the page's script sends it."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(
                "POST",
                path,
                body=json.dumps(body or {}),
                headers={
                    "Content-Type": "application/json",
                    "Cookie": viewer.cookie,
                    "X-CSRFToken": viewer.csrf,
                },
            )
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            conn.close()

    def start_turn(self, viewer: Viewer) -> int:
        """Send the prompt in the viewer's conversation; returns the streaming reply's id."""
        status, body = self.post(viewer, f"/c/{viewer.conversation_id}/turns", {"text": PROMPT})
        if status != 201:
            raise RuntimeError(f"turn refused: {status} {body}")
        return body["reply"]["id"]

    def stop_turn(self, viewer: Viewer, message_id: int) -> None:
        """The Stop button: the reply ends `cancelled` and every client sees it end."""
        status, body = self.post(viewer, f"/m/{message_id}/stop")
        if status != 202:
            raise RuntimeError(f"stop refused: {status} {body}")

    def stop(self) -> None:
        self.service.stop()


class Servers:
    """The Daphnes of one case: the i-th reply and reader go to Daphne i mod their number."""

    def __init__(self, servers: list[BenchServer]) -> None:
        self.all = servers

    def pick(self, index: int) -> BenchServer:
        return self.all[index % len(self.all)]

    def rss(self) -> int:
        return sum(server.rss() for server in self.all)

    def cpu_seconds(self) -> float:
        return sum(server.cpu_seconds() for server in self.all)

    def threads(self) -> int:
        """OS threads of all the Daphnes (an SSE stream once held one each)."""
        return sum(server.process.num_threads() for server in self.all)

    def stop(self) -> None:
        for server in self.all:
            server.stop()
