"""The streaming path under many readers: chat WebSocket and per-message SSE against Daphne.

    .venv/bin/python -m bench.stream --transport ws sse --clients 10 100 1000 [--servers 2]
    .venv/bin/python -m bench.stream --transport ws sse --clients --distinct 1000
    .venv/bin/python -m bench.stream --transport ws --clients --distinct 200 500 --rate 20 \
        --source remote [--servers 2]

Each case starts its own Daphne processes (--servers, free ports, the bench's SQLite database
under var/bench/), starts one streaming reply per watched conversation over HTTP (reply i in
Daphne i mod servers), connects N readers spread over those conversations and, round-robin,
over the Daphnes (at most --connect-concurrency connecting at once), reads the Daphnes' RSS,
records --window seconds of deltas, presses Stop on every reply and waits for every reader
to see the end. --distinct N adds, per transport, a case of N readers each watching a reply
of its own (N distinct replies). Delay is the client's receive time minus `t`, the time the
engine emitted the (first) piece of a delta (same machine, same clock). The token source is
the synthetic runner in each Daphne (--source synthetic, --rate tokens/s per reply), the real
model (--source model), or an OpenAI-compatible stub in a process of its own
(`bench/openai_stub.py`, --rate tokens/s per reply) that the Daphnes stream from through their
real remote-engine client (--source remote: the web tier alone, no engine in its process;
`t` is then when the web process received the piece).
Each row also has the replies, the tokens/s offered (replies × rate) and delivered (pieces of
the deltas emitted inside the window, each reply counted once), whether every reader's text
equals the saved text, and the load average before and after the case.
Prints a Markdown table and writes var/bench/stream.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path

MAX_NEW_TOKENS = 1800
END_TIMEOUT = 60.0
DATABASE = "stream.sqlite3"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transport", nargs="+", choices=["ws", "sse"], default=["ws", "sse"])
    parser.add_argument("--clients", nargs="*", type=int, default=[10, 100, 1000])
    parser.add_argument("--conversations", type=int, default=10, help="replies streaming at once")
    parser.add_argument("--source", choices=["synthetic", "model", "remote"], default="synthetic")
    parser.add_argument("--rate", type=float, default=10.0, help="tokens/s per reply (not model)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of deltas measured")
    parser.add_argument("--connect-concurrency", type=int, default=16)
    parser.add_argument("--servers", type=int, default=1, help="Daphne processes per case")
    parser.add_argument(
        "--turn-concurrency", type=int, default=1, help="turns started at once (SQLite: 1)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="each reply's length"
    )
    parser.add_argument(
        "--distinct", nargs="*", type=int, default=[], help="readers, each of its own reply"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="database, logs, stream.json (var/bench/)"
    )
    return parser.parse_args(argv)


def setup_django(database: Path) -> None:
    """Point this process's Django at the bench's own, fresh SQLite database."""
    database.parent.mkdir(parents=True, exist_ok=True)
    database.unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from bench.stream_server import migrate

    migrate()


def raise_open_files_limit() -> None:
    """A thousand sockets each side need more descriptors than the usual soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start_stub(args: argparse.Namespace):
    """The stub engine's process (--source remote) and its base URL."""
    from tests.support.processes import Service, child_env, free_port, port_open, wait_until

    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "bench.openai_stub",
        "--port",
        str(port),
        "--rate",
        str(args.rate),
    ]
    stub = Service(f"openai-stub-{port}", argv, child_env(), args.workdir / "logs")
    wait_until(lambda: port_open(port) or not stub.alive(), 30, "the stub engine")
    if not stub.alive():
        raise RuntimeError(f"the stub engine exited:\n{stub.log_text()[-3000:]}")
    return stub, f"http://127.0.0.1:{port}"


def server_env(args: argparse.Namespace, conversations: int, engine: str = "") -> dict[str, str]:
    from django.conf import settings

    env = {
        # Production settings, as a deployment runs them: DEBUG keeps every SQL query of each
        # database connection in memory (up to 9,000), tens of KiB per reader at this scale.
        "DEBUG": "0",
        "SECRET_KEY": settings.SECRET_KEY,  # the one that signed the viewers' sessions
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",  # plain HTTP on the loopback, no proxy in front
        # Its own live events channels: another run on the same Redis database (a test suite,
        # a second bench) numbers its conversations from 1 too.
        "TANDEM_CHANNEL_PREFIX": f"bench-{os.getpid()}",
        "TANDEM_ENGINE_SOURCE": "synthetic" if args.source == "remote" else args.source,
        "TANDEM_CHAT_MAX_NEW_TOKENS": str(args.max_new_tokens),
        "TANDEM_MAX_RUNNING": str(max(32, conversations)),
        # A step must hold every decoder plus a prompt token (the engine refuses less), and
        # every reply may wait for its prefill at once (--distinct starts a thousand).
        "TANDEM_MAX_STEP_TOKENS": str(max(512, conversations + 512)),
        "TANDEM_MAX_WAITING": str(max(256, conversations)),
    }
    if args.source == "remote":
        env.update(TANDEM_ENGINE=engine, TANDEM_ENGINE_MODEL="stub")
    if args.source == "synthetic":
        env["TANDEM_SYNTHETIC_TOKENS_PER_S"] = str(args.rate)
        # Greedy: the forced token wins either way, and top-p's sort of the whole vocabulary
        # per row would make the engine, not the streaming path, the bottleneck.
        env["TANDEM_CHAT_TEMPERATURE"] = "0"
    return env


async def run_case(args, transport: str, count: int, viewers: list):
    """--servers Daphnes, `count` readers spread over the viewers' replies; the case's row."""
    from bench.stream_clients import Client, Phase, run_client
    from bench.stream_server import BenchServer, Servers
    from bench.stream_stats import summarize

    conversations = len(viewers)
    stub, engine = start_stub(args) if args.source == "remote" else (None, "")
    env = server_env(args, -(-conversations // args.servers), engine)
    servers = Servers(
        [
            BenchServer(args.workdir / DATABASE, args.workdir / "logs", **env)
            for _ in range(args.servers)
        ]
    )
    try:
        await asyncio.gather(*(asyncio.to_thread(s.wait_ready) for s in servers.all))
        load_before = os.getloadavg()[0]
        # One after another by default; more at once start a thousand faster (SQLite takes
        # each turn's write lock at BEGIN, so they queue), but then every reply is mid-stream
        # while the readers connect, which slows their connects down (see docs/deploy.md).
        starting = asyncio.Semaphore(args.turn_concurrency)

        async def start(index: int, viewer) -> int:
            async with starting:
                return await asyncio.to_thread(servers.pick(index).start_turn, viewer)

        replies = list(await asyncio.gather(*(start(i, v) for i, v in enumerate(viewers))))
        watched = list(zip(viewers, replies, strict=True))
        clients = [
            Client(viewer.conversation_id, reply, viewer.cookie)
            for viewer, reply in (watched[i % conversations] for i in range(count))
        ]
        rss_before = servers.rss()
        gate = asyncio.Semaphore(args.connect_concurrency)
        phase = Phase(count)
        tasks = [
            asyncio.create_task(run_client(client, transport, servers.pick(i), gate, phase))
            for i, client in enumerate(clients)
        ]
        await phase.connected.wait()
        rss_held, threads_held = servers.rss(), servers.threads()
        cpu_server, cpu_bench = servers.cpu_seconds(), time.process_time()
        start = time.time()
        await asyncio.sleep(args.window)
        end = time.time()
        cpu_server = (servers.cpu_seconds() - cpu_server) / (end - start)
        cpu_bench = (time.process_time() - cpu_bench) / (end - start)
        await asyncio.gather(
            *(
                asyncio.to_thread(servers.pick(i).stop_turn, viewer, reply)
                for i, (viewer, reply) in enumerate(watched)
            )
        )
        _, late = await asyncio.wait(tasks, timeout=END_TIMEOUT)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        saved = await asyncio.to_thread(saved_texts, replies)
    finally:
        servers.stop()
        if stub is not None:
            stub.stop()
    return summarize(
        clients,
        (start, end),
        (rss_before, rss_held),
        saved,
        source=args.source if args.source == "model" else f"{args.source} {args.rate:g} tok/s",
        offered_tok_s=None if args.source == "model" else conversations * args.rate,
        transport=transport,
        conversations=conversations,
        servers=args.servers,
        threads_held=threads_held,
        server_cpu=round(cpu_server, 2),
        bench_cpu=round(cpu_bench, 2),
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
    )


def saved_texts(replies: list[int]) -> dict[int, str]:
    """Each reply's text part as saved, by part id (read after every reply ended)."""
    from django.db import close_old_connections

    from chat.models import Part

    try:
        found = Part.objects.filter(message_id__in=replies, kind=Part.Kind.TEXT)
        return dict(found.values_list("pk", "text"))
    finally:
        close_old_connections()


def main(argv: list[str] | None = None) -> list:
    args = parse_args(argv)
    raise_open_files_limit()
    from bench.stream_server import BENCH_DIR

    args.workdir = (args.workdir or BENCH_DIR).resolve()
    (args.workdir / "logs").mkdir(parents=True, exist_ok=True)
    setup_django(args.workdir / DATABASE)
    from bench.stream_server import create_viewers
    from bench.stream_stats import machine, table

    rows = []
    cases = [(count, min(args.conversations, count)) for count in args.clients]
    cases += [(count, count) for count in args.distinct]
    for count, conversations in cases:
        for transport in args.transport:
            viewers = create_viewers(f"{transport}{count}-{conversations}", conversations)
            row = asyncio.run(run_case(args, transport, count, viewers))
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    output = args.workdir / "stream.json"
    output.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": machine(),
                "settings": {k: str(v) for k, v in vars(args).items()},
                "rows": [asdict(row) for row in rows],
            },
            indent=2,
        )
    )
    print(f"\nwrote {output}")
    return rows


if __name__ == "__main__":
    main()
