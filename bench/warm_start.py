"""A restart against a cold start: the web process's time to `"compile": "ready"`, and its speed.

`python -m bench.warm_start` starts Tandem's own server (Daphne, as `make run` does) on an
empty compiled-step cache and times it from process start to `/health` saying the compiled step
is ready; then measures decode speed over HTTP at 1 and 32 streams. Then it stops the server and
starts it again on the same cache, as a restart or a second web process would, and does the
same. Both runs are in one process of the bench, back to back, and the ratios say whether the
restart serves at the cold build's speed. The result goes to var/bench/warm_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import http_load
from bench.engine import STEP_TOKENS, machine
from bench.peers import tandem_http
from bench.peers.served import ServedProcess
from bench.stats import summarise
from bench.workload import chat_messages
from tests.support.processes import BIN, ROOT, free_port

OUT = ROOT / "var" / "bench" / "warm_start.json"
LOGS = ROOT / "var" / "bench" / "warm_start"  # each start's server log


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        return json.load(response)["model"]


def rss_mb(pid: int) -> int:
    """The process's resident memory, in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) // 1024


def start(workdir: Path, env: dict[str, str]) -> tuple[ServedProcess, int, float]:
    """The server on a free port, once its compiled step is ready; its seconds from the
    process's start (the migration before it is not counted)."""
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
    subprocess.run(migrate, cwd=ROOT, env={**os.environ, **env}, check=True)
    port = free_port()
    argv = [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    started = time.perf_counter()
    server = ServedProcess(f"tandem-{port}", argv, env, port, workdir)
    server.wait_ready(
        lambda body: body["model"]["state"] == "ready" and body["model"].get("compile") == "ready",
        timeout=3600,
    )
    return server, port, time.perf_counter() - started


def one_start(
    label: str, workdir: Path, env: dict[str, str], streams: list[int], new_tokens: int
) -> dict:
    """Start, time to ready, decode speed at each streams level, stop."""
    server, port, seconds = start(workdir, env)
    try:
        model = health(port)
        print(f"{label}: compile ready {seconds:.1f} s after the process started", flush=True)
        for size, bucket in model.get("compile_buckets", {}).items():
            print(f"  bucket {size:>4}: {bucket['state']} in {bucket['seconds']} s", flush=True)
        target = http_load.Server(
            f"http://127.0.0.1:{port}/v1", "tandem", env["TANDEM_API_KEYS"], tandem_http.EXTRA
        )
        http_load.run(target, chat_messages(2), 8)  # first requests' set-up
        speeds = {}
        for n in streams:
            figures = summarise(
                label, "burst", new_tokens, http_load.run(target, chat_messages(n), new_tokens)
            )
            speeds[str(n)] = {
                "tokens_per_s": round(figures.tokens_per_s, 1),
                "itl_p50_ms": figures.itl_p50_ms,
            }
            speed, itl = figures.tokens_per_s, figures.itl_p50_ms
            print(f"  {n:>3} streams: {speed:.1f} tok/s, ITL p50 {itl} ms", flush=True)
        rss = rss_mb(server.service.process.pid)
        print(f"  server RSS: {rss} MB", flush=True)
        return {
            "ready_seconds": round(seconds, 1),
            "rss_mb": rss,
            "weights": model.get("weights"),
            "buckets": model.get("compile_buckets", {}),
            "speeds": speeds,
        }
    finally:
        server.stop()
        LOGS.mkdir(parents=True, exist_ok=True)
        shutil.copy(server.service.log_path, LOGS / f"{label.split()[0]}.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--buckets", default="", help="TANDEM_COMPILE_BUCKETS (default: all)")
    args = parser.parse_args()
    launch_load = os.getloadavg()
    print(f"load average at launch: {launch_load}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="tandem-warm-start-"))
    cache = workdir / "compiled"
    settings = tandem_http.Settings(
        max_running=max(32, *args.streams),
        step_tokens=STEP_TOKENS,
        dtype="auto",
        weights=args.weights,
    )
    env = settings.env(workdir) | {"TANDEM_COMPILE_CACHE": str(cache), "LOG_LEVEL": "INFO"}
    if args.buckets:
        env["TANDEM_COMPILE_BUCKETS"] = args.buckets
    try:
        cold = one_start("cold (empty cache)", workdir, env, args.streams, args.new_tokens)
        restart = one_start("restart (cache present)", workdir, env, args.streams, args.new_tokens)
        cache_bytes = sum(path.stat().st_size for path in cache.rglob("*") if path.is_file())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratios = {
        n: round(restart["speeds"][n]["tokens_per_s"] / cold["speeds"][n]["tokens_per_s"], 3)
        for n in cold["speeds"]
    }
    print(f"\nrestart / cold ready time: {restart['ready_seconds']} / {cold['ready_seconds']} s")
    print(f"restart / cold tok/s by streams: {ratios}")
    print(f"cache size: {cache_bytes / 1e9:.2f} GB")
    print(f"load average at the end: {os.getloadavg()}", flush=True)
    result = {
        "machine": machine() | {"load_average_start": launch_load},
        "cold": cold,
        "restart": restart,
        "speed_ratio_restart_over_cold": ratios,
        "cache_bytes": cache_bytes,
        "new_tokens": args.new_tokens,
        "load_end": os.getloadavg(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"written: {OUT}")


if __name__ == "__main__":
    main()
