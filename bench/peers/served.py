"""A server the bench starts for an HTTP peer: on a free port, ready when its /health says so.

The process runs in its own session and is stopped by its own pid (SIGTERM, then SIGKILL), never
by name, so a bench run leaves nothing behind and touches no one else's servers.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.support.processes import Service, port_open, wait_until

Ready = Callable[[dict], bool]


class ServedProcess:
    """One server process (this environment plus `env`) and the URL that says it is ready."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], port: int, log_dir: Path
    ) -> None:
        self.port = port
        self.service = Service(name, argv, {**os.environ, **env}, log_dir)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, ready: Ready, timeout: float = 300) -> None:
        """Until GET /health answers 200 with a body `ready` accepts; the log if it died."""

        def check() -> bool:
            if not self.service.alive():
                raise RuntimeError(f"{self.service.name} exited:\n{self.log_tail()}")
            if not port_open(self.port):
                return False
            try:
                with urllib.request.urlopen(f"{self.origin}/health", timeout=5) as response:
                    return ready(json.load(response))
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        try:
            wait_until(check, timeout, f"{self.service.name} to be ready", interval=0.25)
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from exc

    def log_tail(self, chars: int = 3000) -> str:
        return self.service.log_text()[-chars:]

    def stop(self) -> None:
        self.service.stop()
