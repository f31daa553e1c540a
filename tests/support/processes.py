"""Starting and stopping the real processes a test needs, by pid, never by name."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on the port."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval=0.05) -> None:
    """Poll a condition until it holds, failing the test with `what` after the timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Service:
    """A child process with its output in a log file; stopped by its own pid."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send a signal to this process's own group (it and the children it forked)."""
        if self.alive():
            os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL if it has not exited in time."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        self._log.close()


def child_env(**overrides: str) -> dict[str, str]:
    """The test process's environment plus overrides, for a child server or worker.

    REDIS_URL is taken from the settings this process resolved, so children always share
    its broker and channel layer.
    """
    from django.conf import settings

    env = dict(os.environ)
    env.update(
        {
            "DEBUG": "1",
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{BIN}:{env.get('PATH', '')}",
            "REDIS_URL": settings.REDIS_URL,
            "TANDEM_COMPILE": os.environ.get("TANDEM_COMPILE", "0"),
        }
    )
    env.update(overrides)
    return env
