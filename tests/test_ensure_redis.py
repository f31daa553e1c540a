"""`make`'s Redis step: reuse a Redis that answers, start one when possible, else explain."""

import os
import signal
import subprocess
import sys

import pytest
import redis

from config import ensure_redis
from tests.support.processes import ROOT, child_env, free_port, wait_until


def ensure(tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "config.ensure_redis"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=child_env(TANDEM_VAR_DIR=str(tmp_path), **env),
        timeout=60,
    )


def test_starts_a_local_redis_when_none_answers(tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    result = ensure(tmp_path, REDIS_URL=url)
    assert result.returncode == 0, result.stderr
    pid = int((tmp_path / f"redis-{port}.pid").read_text())
    try:
        assert f"(pid {pid}" in result.stdout
        assert redis.Redis.from_url(url).ping()
        again = ensure(tmp_path, REDIS_URL=url)
        assert again.stdout.startswith("Redis answers at")
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10, "our redis-server to exit")


def test_explains_what_to_install_when_redis_server_is_missing(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = ensure(tmp_path, REDIS_URL=url, PATH=os.path.dirname(sys.executable))
    assert result.returncode == 1
    assert "redis-server is not installed" in result.stderr
    assert "apt-get install redis-server" in result.stderr


def test_refuses_to_start_a_remote_redis(tmp_path, monkeypatch):
    # No packet may leave this machine, so the remote Redis's silence is simulated.
    monkeypatch.setattr(ensure_redis, "answers", lambda url: False)
    with pytest.raises(SystemExit, match="not local"):
        ensure_redis.ensure("redis://cache.example.com:6379/0", tmp_path)
