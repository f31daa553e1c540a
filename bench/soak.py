"""A soak of the local stack: mixed load for minutes, resources sampled every 10 s.

    make soak MINUTES=30          # or: .venv/bin/python -m bench.soak --minutes 30

It starts its own stack on free ports: a redis-server (so the keys and memory measured are
the soak's own), a PostgreSQL database of its own on the machine's server (created, then
dropped), Daphne with the real model and its compiled step (the load waits for it), a Celery
worker and beat. Chat users send turns with and without images, read replies over SSE, drop
and resume streams, press Stop and retry images; image renders fail at 20%
(TANDEM_IMAGE_FAILURE_RATE); an API client calls the OpenAI and TGI routes. The sampler records
each process's RSS and open files, PostgreSQL's connections to the soak's database, and Redis's
memory and keys (bench/soak_sampler.py); the report ends with Redis's clients as the load
stopped: who holds each, since when and for what (their last command).

When the time is up the load stops, every part is given time to end, and the run passes when:
from the first window after warm-up to the last (each a tenth of the time measured, a
minute at least), each process's RSS grew under 2% per hour and
every other series under 5% in all, no part is left unfinished, no response was a 5xx, and
the text every reader put together from the deltas equals the text saved in the database.
Writes var/soak/<timestamp>.json and .png and exits 1 on a failed bar. docs/reliability.md
quotes the last documented run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime

import psutil
import psycopg

from bench.soak_load import ApiClient, ChatUser, Tally
from bench.soak_sampler import Sampler, growth, plot, postgres_pids
from tests.support.processes import BIN, ROOT, Service, child_env, free_port, wait_until

GROWTH_BAR = 0.05  # open files, connections, Redis: flat after warm-up
RSS_GROWTH_PER_HOUR_BAR = 0.02  # memory: a leak shows as a steady rise per hour
DRAIN_TIMEOUT = 240.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--warmup-minutes", type=float, default=None, help="default: a third, at most 10"
    )
    parser.add_argument("--users", type=int, default=4, help="chat users sending turns")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    return parser.parse_args(argv)


def admin_sql(server: str, sql: str) -> None:
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def connection_counter(server: str, database: str):
    """Counts the server's connections to the soak's database (this counter's excluded)."""

    def count() -> int:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
            return conn.execute(query, (database,)).fetchone()[0]

    return count


def setup_django(database_url: str, redis_url: str) -> None:
    """This process's Django on the soak's database, without a pool of its own (so the
    connections counted are the stack's), and the soak's users."""
    os.environ.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        DATABASE_POOL_SIZE="0",
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    import django

    django.setup()
    from bench.stream_server import migrate

    migrate()


def wait_for_compiled_step(url: str, timeout: float = 1800) -> None:
    """The load starts once the compiled step is loaded (or built: `make compile` ahead
    saves that), so the warm-up measures serving, not compiling."""
    started = time.monotonic()

    def settled() -> bool:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            state = json.load(response)["model"].get("compile", "off")
        return state != "warming"

    wait_until(settled, timeout, "the compiled step", interval=2)
    print(f"soak: compiled step settled after {time.monotonic() - started:.0f} s", flush=True)


def start_stack(logs, workdir, env: dict[str, str]) -> tuple[dict[str, Service], int]:
    """Daphne (waits for the model), the worker and beat; returns them by name, and the
    web port."""
    from tests.conftest import start_daphne, wait_for_model
    from tests.support.media import start_worker

    web = start_daphne("daphne-soak", logs, **env)
    services = {"daphne": web.service}
    try:
        wait_for_model(web, timeout=600)
        wait_for_compiled_step(web.url)
        services["worker"] = start_worker(logs, concurrency=1, **env).service
        beat = [str(BIN / "celery"), "-A", "config", "beat", "-l", "info"]
        beat += ["-s", str(workdir / "beat-schedule")]
        services["beat"] = Service("beat-soak", beat, child_env(**env), logs)
    except BaseException:
        for service in services.values():
            service.stop()
        raise
    return services, web.port


def run_load(port: int, viewers, args, sampler: Sampler) -> tuple[Tally, list[ChatUser]]:
    """Drive the mixed load for the run's minutes; print a line a minute."""
    tally, stop = Tally(), threading.Event()
    users = [ChatUser(port, viewer, tally, stop, seed) for seed, viewer in enumerate(viewers)]
    api = ApiClient(port, tally, stop)
    for thread in [*users, api]:
        thread.start()
    started = time.monotonic()
    end = started + args.minutes * 60
    while (now := time.monotonic()) < end:
        time.sleep(min(60.0, end - now))
        last = sampler.samples[-1]
        print(
            f"  {(time.monotonic() - started) / 60:5.1f} min: {dict(tally.statuses)}; "
            f"daphne {last['rss_mb.daphne']} MB, load {last['load_average_1m']}",
            flush=True,
        )
    stop.set()
    sampler.stop.set()
    for thread in [*users, api]:
        thread.join(200)
    return tally, users


def reply_slots(rows: list[tuple], since: datetime, minutes: float = 10.0) -> list[dict]:
    """Per `minutes` of load, the text replies that started then and succeeded: how many, and
    the median seconds from start to first token and to the end. `rows` are (started,
    first token, finished) times. Not judged: it says when replies slowed, which the samples
    of cores and ITL then explain."""
    slots: dict[int, list[tuple[float, float]]] = {}
    for started, first_token, finished in rows:
        slot = int((started - since).total_seconds() // (minutes * 60))
        waited = (first_token - started).total_seconds()
        slots.setdefault(slot, []).append((waited, (finished - started).total_seconds()))
    return [
        {
            "from_minute": slot * minutes,
            "replies": len(times),
            "median_first_token_s": round(statistics.median(t[0] for t in times), 3),
            "median_reply_s": round(statistics.median(t[1] for t in times), 3),
        }
        for slot, times in sorted(slots.items())
        if slot >= 0
    ]


def succeeded_replies(since: datetime) -> list[tuple]:
    """(started, first token, finished) of the text parts that succeeded since `since`."""
    from chat.models import Part

    done = Part.objects.filter(
        kind=Part.Kind.TEXT, state=Part.State.SUCCEEDED, started_at__gte=since
    ).exclude(first_token_at=None)
    return list(
        done.exclude(finished_at=None).values_list("started_at", "first_token_at", "finished_at")
    )


def comparison_window(measured: float, interval: float) -> float:
    """Seconds of samples whose median stands for the start (and for the end) of the
    measured span: a tenth of it, a minute at least, so that a series that swings (Redis's
    keys of live streams, the open files) is judged by its level, not by where one minute of
    it happened to sit."""
    return max(60.0, 3 * interval, measured / 10)


def over_bar(key: str, grown: dict) -> bool:
    """RSS by its growth per hour, every other series by its growth over the run."""
    if key.startswith("rss_mb."):
        return (grown["growth_per_hour"] or 0) >= RSS_GROWTH_PER_HOUR_BAR
    return (grown["growth"] or 0) >= GROWTH_BAR


def verdict(tally: Tally, users: list[ChatUser], grown: dict, logs) -> dict:
    """Every part final, 0 5xx, streamed text == saved text, growth under the bar."""
    from chat.models import Part
    from chat.states import TERMINAL

    def unfinished() -> int:
        return Part.objects.exclude(state__in=TERMINAL).count()

    with contextlib.suppress(TimeoutError):  # what is still unfinished is counted below
        wait_until(lambda: unfinished() == 0, DRAIN_TIMEOUT, "every part to end", interval=1)
    saved = {p.pk: p for p in Part.objects.all()}
    streamed = [s for user in users for s in user.streamed]
    lost = [
        s.part_id
        for s in streamed
        if s.gaps or saved[s.part_id].text != s.text or saved[s.part_id].seq != s.seq
    ]
    by_kind = {
        kind: dict(Counter(p.state for p in saved.values() if p.kind == kind))
        for kind in (Part.Kind.TEXT, Part.Kind.IMAGE)
    }
    over = {key: g for key, g in grown.items() if over_bar(key, g)}
    web_log = (logs / "daphne-soak.log").read_text(errors="replace")
    checks = {
        "stuck_parts": unfinished(),
        "server_errors_5xx": tally.server_errors(),
        "text_parts_streamed_and_compared": len(streamed),
        "text_parts_lost_text": len(lost),
        "series_over_growth_bar": over,
        "internal_server_errors_in_web_log": web_log.count("Internal Server Error"),
        "tracebacks_in_web_log": web_log.count("Traceback"),
    }
    checks["passed"] = (
        checks["stuck_parts"] == 0
        and checks["server_errors_5xx"] == 0
        and not lost
        and not over
        and len(streamed) > 0
    )
    return {"checks": checks, "parts_by_kind_and_state": by_kind, "lost_text_parts": lost}


def stop_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM or SIGINT ends the run through its `finally`s: the stack it started is
    stopped by pid and its database dropped."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Both, also when started in the background (where a shell leaves SIGINT ignored).
    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGINT, stop_on_signal)
    warmup = 60 * (args.warmup_minutes or min(10.0, args.minutes / 3))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    workdir = ROOT / "var" / "soak" / stamp
    logs = workdir / "logs"
    logs.mkdir(parents=True)
    database = f"tandem_soak_{stamp.lower()}"
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    pool_size = os.environ.get("DATABASE_POOL_SIZE", "10")
    admin_sql(args.postgres, f'CREATE DATABASE "{database}"')
    load_before = psutil.getloadavg()
    try:
        setup_django(f"{args.postgres}/{database}", redis_url)
        from django.db import connections

        from bench.stream_server import create_viewers
        from tests.support.media import RedisServer

        viewers = create_viewers("soak", args.users)
        connections.close_all()
        redis_server = RedisServer(redis_port, logs).start()
        env = {
            "REDIS_URL": redis_url,
            "DATABASE_POOL_SIZE": pool_size,
            "MEDIA_ROOT": str(workdir / "media"),
            "TANDEM_COMPILE": "1",  # the product's default (tests run eagerly)
            "TANDEM_CHAT_MAX_NEW_TOKENS": "48",
            "TANDEM_IMAGE_FAILURE_RATE": "0.2",
            "TANDEM_IMAGE_STEPS": "6",
            "TANDEM_IMAGE_STEP_DELAY": "0.1",
            "TANDEM_IMAGE_RETRY_BACKOFF": "1",
        }
        try:
            print(f"soak: starting the stack in {workdir}", flush=True)
            services, port = start_stack(logs, workdir, env)
            try:
                pids = {name: service.pid for name, service in services.items()}
                pids["redis"] = redis_server.service.pid
                counter = connection_counter(args.postgres, database)
                sampler = Sampler(
                    pids,
                    redis_url,
                    counter,
                    threading.Event(),
                    args.interval,
                    metrics_url=f"http://127.0.0.1:{port}/metrics",
                    cpu_only={"soak load": lambda: [os.getpid()], "postgres": postgres_pids},
                )
                sampler.start()
                print(f"soak: load for {args.minutes:g} min, warm-up {warmup / 60:g} min")
                load_started = datetime.now(UTC)
                tally, users = run_load(port, viewers, args, sampler)
                sampler.join(30)
                window = comparison_window(args.minutes * 60 - warmup, args.interval)
                if args.minutes * 60 < warmup + 2 * window:  # the two windows would overlap
                    print("soak: too short to measure growth after warm-up; not checked")
                    grown = {}
                else:
                    grown = growth(sampler.samples, warmup, window)
                result = verdict(tally, users, grown, logs)
                result["replies_every_10_minutes"] = reply_slots(
                    succeeded_replies(load_started), load_started
                )
            finally:
                for service in services.values():
                    service.stop()
        finally:
            redis_server.stop()
            connections.close_all()
    finally:
        admin_sql(args.postgres, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    report = {
        "command": " ".join(["bench.soak", *(argv if argv is not None else sys.argv[1:])]),
        "started": stamp,
        "minutes": args.minutes,
        "warmup_minutes": warmup / 60,
        "users": args.users,
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": load_before},
        "load_average_at_end": psutil.getloadavg(),
        **result,
        "growth_after_warmup": grown,
        "http_statuses": dict(tally.statuses),
        "events": dict(tally.events),
        "client_errors": tally.errors,
        "turns_per_user": [user.turns for user in users],
        "redis_clients_at_end": sampler.clients,
        "samples": sampler.samples,
    }
    out = ROOT / "var" / "soak" / f"{stamp}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    title = f"soak {stamp}: {args.minutes:g} min, {args.users} chat users + 1 API client"
    plot(sampler.samples, warmup, out.with_suffix(".png"), title)
    checks = result["checks"]
    print(json.dumps({"checks": checks, "statuses": report["http_statuses"]}, indent=2))
    for slot in result["replies_every_10_minutes"]:
        print(
            f"  minutes {slot['from_minute']:g}+: {slot['replies']} replies, median "
            f"{slot['median_reply_s']} s ({slot['median_first_token_s']} s to the first token)"
        )
    print(f"soak {'PASSED' if checks['passed'] else 'FAILED'}: {out}")
    return 0 if checks["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
