"""Make sure the configured Redis answers, starting a local one when that is possible.

Run as `python -m config.ensure_redis` by `make run` and `make test`. A Redis it starts is
bound to 127.0.0.1, keeps nothing on disk, and its pid is printed and written under var/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

DEFAULT_URL = "redis://127.0.0.1:6379/0"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


def answers(url: str, timeout: float = 1.0) -> bool:
    """True when a PING to the URL succeeds."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def start_local(port: int, var_dir: Path) -> int:
    """Start a daemonised redis-server on 127.0.0.1:port and return its pid."""
    var_dir.mkdir(parents=True, exist_ok=True)
    pidfile = var_dir / f"redis-{port}.pid"
    subprocess.run(
        [
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(var_dir),
            "--logfile",
            str(var_dir / f"redis-{port}.log"),
            "--pidfile",
            str(pidfile),
        ],
        check=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if pidfile.is_file() and pidfile.read_text().strip():
            return int(pidfile.read_text().strip())
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not write {pidfile}")


def ensure(url: str, var_dir: Path) -> str:
    """Return a line saying how Redis answers, or raise SystemExit with what to do."""
    if answers(url):
        return f"Redis answers at {url}"
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
    if host not in LOCAL_HOSTS:
        raise SystemExit(f"Redis does not answer at {url}; it is not local, so start it there.")
    if shutil.which("redis-server") is None:
        raise SystemExit(
            f"Redis does not answer at {url} and redis-server is not installed. "
            "Install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) "
            "or point REDIS_URL at a running Redis."
        )
    pid = start_local(port, var_dir)
    deadline = time.monotonic() + 10
    while not answers(url):
        if time.monotonic() > deadline:
            raise SystemExit(f"Started redis-server (pid {pid}) but it does not answer at {url}.")
        time.sleep(0.1)
    return f"Started redis-server on 127.0.0.1:{port} (pid {pid}; stop it with: kill {pid})"


def main() -> None:
    """Entry point for the Makefile."""
    url = os.environ.get("REDIS_URL", "").strip() or DEFAULT_URL
    default_var = Path(__file__).resolve().parent.parent / "var"
    var_dir = Path(os.environ.get("TANDEM_VAR_DIR", "").strip() or default_var)
    print(ensure(url, var_dir))


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            sys.exit(1)
        raise
