"""Tandem's own server, Daphne on `config.asgi:application`, driven over HTTP by `bench.http_load`.

The same web process `make run` starts, with its engine loaded in the background; only the
settings differ: SQLite and the var directory in a temporary folder (migrated first), one API key
made for the run, and the engine's limits and weights from the bench's arguments. It stays up
across the streams levels, as a deployment would. One signed-in WebSocket stays open on it
(`bench.ws_ping`) and times round trips while each level runs: does Daphne keep answering?
Requests ask for `ignore_eos` (the OpenAI extension vLLM also takes), so every stream generates
exactly max_tokens.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import http_load, ws_ping
from bench.peers.served import ServedProcess
from bench.session_cookie import signed_in
from bench.stats import PeerRun
from tests.support.processes import BIN, ROOT, free_port

NAME = "tandem-http"
EXTRA = {"ignore_eos": True}


@dataclass(frozen=True)
class Settings:
    """What the bench sets for the server: the engine's limits, dtype, weights, model, threads."""

    max_running: int
    step_tokens: int
    dtype: str
    weights: str
    model: str | None = None
    threads: int | None = None
    compile: bool = True

    def env(self, workdir: Path) -> dict[str, str]:
        """The environment the server and its migration run with."""
        env = {
            "DEBUG": "1",
            "PYTHONUNBUFFERED": "1",
            "TANDEM_VAR_DIR": str(workdir),
            "DATABASE_URL": f"sqlite:///{workdir / 'tandem.sqlite3'}",
            "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            "TANDEM_API_KEYS": secrets.token_urlsafe(24),
            "TANDEM_MAX_RUNNING": str(self.max_running),
            "TANDEM_MAX_STEP_TOKENS": str(self.step_tokens),
            "TANDEM_DTYPE": self.dtype,
            "TANDEM_WEIGHTS": self.weights,
            "TANDEM_COMPILE": "1" if self.compile else "0",
            # The HTTP rounds repeat their prompts; llama.cpp's prompt cache is off too.
            "TANDEM_PREFIX_REUSE": "0",
            "TANDEM_LOG_FORMAT": "plain",
            "LOG_LEVEL": "WARNING",
        }
        if self.model:
            env["TANDEM_MODEL"] = self.model
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)  # torch's intra-op threads in the server
        return env


class TandemServer:
    """Daphne with Tandem on a free port, until /health says the engine is ready."""

    def __init__(self, workdir: Path, settings: Settings) -> None:
        self.env = settings.env(workdir)
        port = free_port()
        argv = [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
        self.workdir = workdir
        self.argv, self.port = argv, port
        self.process: ServedProcess | None = None
        self.pinger: ws_ping.Pinger | None = None

    def __enter__(self) -> TandemServer:
        migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
        subprocess.run(migrate, cwd=ROOT, env={**os.environ, **self.env}, check=True)
        self.process = ServedProcess(
            f"tandem-{self.port}", self.argv, self.env, self.port, self.workdir
        )
        try:
            # Ready once the engine serves and its compiled step (if any) is built.
            self.process.wait_ready(
                lambda body: (
                    body["model"]["state"] == "ready" and body["model"].get("compile") != "warming"
                ),
                timeout=1200,
            )
            url = f"ws://127.0.0.1:{self.port}{ws_ping.PATH}"
            cookie = signed_in(self.env, "ws-ping")
            self.pinger = ws_ping.Pinger(url, self.process.origin, cookie).__enter__()
        except BaseException:
            self.process.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.pinger is not None:
                self.pinger.__exit__(*exc)
        finally:
            if self.process is not None:
                self.process.stop()

    @property
    def server(self) -> http_load.Server:
        origin = f"http://127.0.0.1:{self.port}/v1"
        return http_load.Server(origin, "tandem", self.env["TANDEM_API_KEYS"], EXTRA)

    def run(self, conversations: list[http_load.Messages], new_tokens: int) -> PeerRun:
        return http_load.run(self.server, conversations, new_tokens)

    def run_pinged(
        self, conversations: list[http_load.Messages], new_tokens: int
    ) -> tuple[PeerRun, ws_ping.Pings]:
        """`run`, while the WebSocket on the same Daphne times its round trips."""
        return self.pinger.measure(lambda: self.run(conversations, new_tokens))

    def idle_pings(self, seconds: float) -> ws_ping.Pings:
        """The round trips with no load on the server, for `seconds`."""
        return self.pinger.idle(seconds)
