"""Does Daphne keep answering while its engine decodes 32 streams? A WebSocket ping's RTT.

    .venv/bin/python -m bench.ws_ping                     # threads: torch's default (all cores)
    .venv/bin/python -m bench.ws_ping --threads 1 2       # one Daphne per setting, same run

The engine runs on a thread of the web process, so every model step competes with the
event loop that serves pages and sockets (for the GIL between kernels, and for the cores
inside them). For each TANDEM_TORCH_THREADS setting this starts a Daphne on the real model
(its own SQLite database, the compiled decode step, waited for), pings the channel-layer
echo socket (/ws/diagnostics/echo/) every 50 ms while idle, then while 32 chat turns decode,
and prints the round trip's p50/p99/max per phase and the cores Daphne kept busy. Results go
to var/bench/ws_ping.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path

import numpy as np
import websockets

from bench.stream import setup_django
from bench.stream_server import BENCH_DIR, BenchServer, create_viewers
from tests.support.processes import wait_until

INTERVAL = 0.05
STREAMS = 32


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[0], help="0: torch's default")
    parser.add_argument("--seconds", type=float, default=15.0, help="per phase")
    return parser.parse_args()


def health(server: BenchServer) -> dict:
    with urllib.request.urlopen(f"{server.origin}/health", timeout=5) as response:
        return json.load(response)


async def ping(url: str, origin: str, cookie: str, seconds: float) -> list[float]:
    """Round trips of echo frames sent every INTERVAL for `seconds`, in milliseconds."""
    rtts: list[float] = []
    async with websockets.connect(
        url, origin=origin, additional_headers={"Cookie": cookie}, open_timeout=30
    ) as ws:
        deadline = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            await ws.send(json.dumps({"n": n}))
            await asyncio.wait_for(ws.recv(), 30)
            rtts.append(1000 * (time.perf_counter() - sent))
            n += 1
            await asyncio.sleep(max(0.0, INTERVAL - (time.perf_counter() - sent)))
    return rtts


def summary(rtts: list[float]) -> dict[str, float]:
    return {
        "pings": len(rtts),
        "p50_ms": round(float(np.percentile(rtts, 50)), 1),
        "p99_ms": round(float(np.percentile(rtts, 99)), 1),
        "max_ms": round(max(rtts), 1),
    }


def measure(threads: int, seconds: float, log_dir: Path) -> dict[str, object]:
    """One Daphne with this thread setting: idle pings, then pings under 32 streams."""
    viewers = create_viewers(f"ping{threads}-{int(time.time())}", STREAMS + 1)
    env = {"TANDEM_COMPILE": "1", "TANDEM_TORCH_THREADS": str(threads)}
    server = BenchServer(BENCH_DIR / "ws_ping.sqlite3", log_dir, **env)
    try:
        server.wait_ready(600)
        wait_until(
            lambda: (
                health(server)["model"].get("compile") in ("ready", "off")
                or health(server)["model"].get("compile", "").startswith("failed")
            ),
            1200,
            "the compiled decode step",
            interval=1.0,
        )
        model = health(server)["model"]
        url = f"ws://127.0.0.1:{server.port}/ws/diagnostics/echo/"
        pinger = viewers[-1]
        idle = asyncio.run(ping(url, server.origin, pinger.cookie, seconds))
        replies = [(viewer, server.start_turn(viewer)) for viewer in viewers[:STREAMS]]
        time.sleep(3.0)  # every prompt prefilled: the 32 are decoding
        started, cpu = time.perf_counter(), server.cpu_seconds()
        busy = asyncio.run(ping(url, server.origin, pinger.cookie, seconds))
        busy_seconds = time.perf_counter() - started
        cpu_share = (server.cpu_seconds() - cpu) / busy_seconds
        for viewer, reply in replies:
            server.stop_turn(viewer, reply)
    finally:
        server.stop()
    return {
        "torch_threads": threads or "default",
        "weights": model.get("weights"),
        "compile": model.get("compile"),
        "idle": summary(idle),
        "decoding_32": summary(busy),
        "daphne_cpu_cores_busy": round(cpu_share, 2),
    }


def main() -> None:
    args = parse()
    setup_django(BENCH_DIR / "ws_ping.sqlite3")
    log_dir = BENCH_DIR / "ws_ping-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"load average at start {os.getloadavg()}", flush=True)
    results = []
    for threads in args.threads:
        result = measure(threads, args.seconds, log_dir)
        results.append(result)
        print(json.dumps(result), flush=True)
    print(f"load average at end {os.getloadavg()}", flush=True)
    (BENCH_DIR / "ws_ping.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
