"""The soak's sampler: every 10 s, each process's memory and open files, the database's
connections, Redis's memory and keys; then growth after warm-up, and the plot.

Beside them it records what the machine and the engine did over each interval: the cores
each process used (and the soak's own load and the PostgreSQL server, which share the
machine), the share of CPU time the host stole, and the engine's tokens/s and mean
inter-token latency (from the web process's /metrics). They tell a slower host (steal up, the
same CPU per token) from a slower engine (ITL up with nothing stolen) when replies slow down.
And it breaks the open files down by kind and Redis's clients by the process that holds them,
so a step names its source. None of these is judged for growth.

Growth compares the median of a series over the first window after warm-up with its median
over the run's last window, so one busy moment (a reply in flight, a connection borrowed)
does not count as growth; a leak moves the median. The database's connections are judged by
their high-water mark instead: a request holds one while it runs and the kept threads
(`chat/kept_connections.py`) hold theirs until 5 s without work, so the count at a moment says
what happened to be running (7 and 9 in turn a whole run, window medians 7 then 9), while a
leak sets new highs.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import redis
from prometheus_client.parser import text_string_to_metric_families

MB = 1024 * 1024
# Never judged: load over an interval, and breakdowns of the judged totals.
UNJUDGED = ("load_average_1m", "cores.", "steal_share", "engine_", "fds.", "redis_clients.")
# Judged by the most seen in the last window against the most seen before it.
HIGH_WATER = ("db_connections",)
ITL = "tandem_engine_inter_token_latency_seconds"
GENERATED = "tandem_engine_generated_tokens"


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and its children (a Celery worker's pool processes), alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_figures(pid: int) -> tuple[float, int, float]:
    """RSS in MB, open file descriptors and CPU seconds (user + system), summed over the
    process and its children."""
    rss, files, cpu = 0, 0, 0.0
    for process in process_tree(pid):
        try:
            rss += process.memory_info().rss
            files += process.num_fds()
            times = process.cpu_times()
            cpu += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return round(rss / MB, 1), files, cpu


def fd_kinds(pid: int) -> Counter:
    """The process tree's open files by kind: socket, pipe, anon (epoll, eventfd) or file."""
    kinds: Counter = Counter()
    for process in process_tree(pid):
        try:
            fds = list(Path(f"/proc/{process.pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile (the listing's own, for one)
                continue
            kind = target.split(":", 1)[0] if target[:1] != "/" else "file"
            kinds["anon" if kind == "anon_inode" else kind] += 1
    return kinds


def tcp_owners(processes: dict[str, int]) -> dict[int, str]:
    """The local TCP ports each process tree holds, to the tree's name."""
    owners = {}
    for name, pid in processes.items():
        for process in process_tree(pid):
            try:
                for conn in process.net_connections(kind="tcp"):
                    owners[conn.laddr.port] = name
            except psutil.Error:
                continue
    return owners


def redis_clients(client: redis.Redis, processes: dict[str, int]) -> list[dict]:
    """Redis's client connections with the process that holds each ("soak": the soak's own,
    None: another one), their age and idle seconds and the last command."""
    owners = tcp_owners({"soak": os.getpid(), **processes})
    return [
        {
            "owner": owners.get(int(entry["addr"].rsplit(":", 1)[1])),
            "age_s": int(entry["age"]),
            "idle_s": int(entry["idle"]),
            "cmd": entry["cmd"],
            "name": entry["name"],
        }
        for entry in client.client_list()
    ]


def postgres_pids() -> list[int]:
    """The PostgreSQL server's processes on this machine (the postmaster and its children)."""
    for process in psutil.process_iter(["name"]):
        try:
            if process.info["name"] == "postgres" and process.parent().name() != "postgres":
                return [p.pid for p in process_tree(process.pid)]
        except (psutil.Error, AttributeError):
            continue
    return []


def engine_totals(metrics_url: str) -> dict[str, float]:
    """The engine's cumulative ITL sum and count and tokens generated, from /metrics (empty
    when the page does not answer)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    totals = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (f"{ITL}_sum", f"{ITL}_count", f"{GENERATED}_total"):
                totals[sample.name] = sample.value
    return totals


def interval_rates(before: dict, after: dict, seconds: float) -> dict[str, float | None]:
    """What happened between two readings of cumulative totals: cores used per process, the
    host's steal share, the engine's tokens/s and mean ITL (None where nothing moved)."""
    rates: dict[str, float | None] = {}
    for key, value in after.items():
        if key.startswith("cpu_s."):
            rates[f"cores.{key[6:]}"] = round((value - before[key]) / seconds, 3)
    elapsed = after["cpu_total"] - before["cpu_total"]  # every core's time, idle included
    rates["steal_share"] = (
        round((after["steal"] - before["steal"]) / elapsed, 4) if elapsed else None
    )
    tokens = after.get(f"{GENERATED}_total", 0) - before.get(f"{GENERATED}_total", 0)
    rates["engine_tok_s"] = round(tokens / seconds, 1)
    gaps = after.get(f"{ITL}_count", 0) - before.get(f"{ITL}_count", 0)
    spent = after.get(f"{ITL}_sum", 0) - before.get(f"{ITL}_sum", 0)
    rates["engine_itl_ms"] = round(spent / gaps * 1000, 2) if gaps else None
    return rates


class Sampler(threading.Thread):
    """Samples every `interval` seconds until `stop` is set; `samples` holds the rows."""

    def __init__(
        self,
        processes: dict[str, int],
        redis_url: str,
        db_connections: Callable[[], int],
        stop: threading.Event,
        interval: float = 10.0,
        metrics_url: str | None = None,
        cpu_only: dict[str, Callable[[], list[int]]] | None = None,
    ) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.processes, self.redis_url = processes, redis_url
        self.db_connections, self.stop, self.interval = db_connections, stop, interval
        self.metrics_url = metrics_url
        self.cpu_only = cpu_only or {}  # groups whose cores are recorded, nothing else
        self.started = time.monotonic()
        self.samples: list[dict] = []
        self.clients: list[dict] = []  # Redis's clients at the last sample
        self._totals: tuple[float, dict] | None = None
        self._cpu_by_pid: dict[str, dict[int, float]] = {}

    def run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self.stop.wait(self.interval):
                return

    def sample(self) -> dict:
        now = time.monotonic()
        row: dict = {"t": round(now - self.started, 1)}
        machine = psutil.cpu_times()
        totals = {"cpu_total": sum(machine), "steal": getattr(machine, "steal", 0.0)}
        for name, pid in self.processes.items():
            row[f"rss_mb.{name}"], row[f"open_files.{name}"], totals[f"cpu_s.{name}"] = (
                tree_figures(pid)
            )
        if self.metrics_url:
            totals.update(engine_totals(self.metrics_url))
        cores = self.group_cores(now - self._totals[0] if self._totals else None)
        if self._totals is not None:
            row.update(interval_rates(self._totals[1], totals, now - self._totals[0]))
        row.update(cores)  # empty on the first sample
        self._totals = (now, totals)
        for name, pid in self.processes.items():
            row.update({f"fds.{name}.{kind}": n for kind, n in sorted(fd_kinds(pid).items())})
        row["db_connections"] = self.db_connections()
        with redis.Redis.from_url(self.redis_url, socket_timeout=5) as client:
            row["redis_used_memory_mb"] = round(client.info("memory")["used_memory"] / MB, 2)
            row["redis_keys"] = client.dbsize()
            self.clients = redis_clients(client, self.processes)
        for owner, n in sorted(Counter(c["owner"] or "other" for c in self.clients).items()):
            row[f"redis_clients.{owner}"] = n
        row["load_average_1m"] = round(psutil.getloadavg()[0], 2)
        return row

    def group_cores(self, seconds: float | None) -> dict[str, float]:
        """Cores each `cpu_only` group used in the last `seconds` (None: the first call, which
        only reads), summed per process, so processes that started meanwhile count and those
        that ended do not go negative."""
        rates = {}
        for name, pids in self.cpu_only.items():
            now = {}
            for pid in pids():
                try:
                    times = psutil.Process(pid).cpu_times()
                except psutil.Error:
                    continue
                now[pid] = times.user + times.system
            before = self._cpu_by_pid.get(name, {})
            self._cpu_by_pid[name] = now
            if seconds:
                used = sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items())
                rates[f"cores.{name}"] = round(used / seconds, 3)
        return rates


def growth(samples: list[dict], warmup: float, window: float) -> dict[str, dict]:
    """Per series: the median of the first window after warm-up, of the last window, and the
    growth between them, in all and per hour between the windows' middles (fractions; None
    when the baseline is 0). A `HIGH_WATER` series: the most seen from warm-up to the last
    window, and the most seen in it."""
    end = samples[-1]["t"]
    first = [s for s in samples if warmup <= s["t"] < warmup + window]
    last = [s for s in samples if s["t"] > end - window]
    before_last = [s for s in samples if warmup <= s["t"] <= end - window]
    hours = statistics.median(s["t"] for s in last) - statistics.median(s["t"] for s in first)
    hours /= 3600
    series = [key for key in samples[0] if key != "t" and not key.startswith(UNJUDGED)]
    figures = {}
    for key in series:
        if key.startswith(HIGH_WATER):
            judged_by = "high-water"
            baseline = max(s[key] for s in before_last)
            final = max(s[key] for s in last)
        else:
            judged_by = "median"
            baseline = statistics.median(s[key] for s in first)
            final = statistics.median(s[key] for s in last)
        change = (final - baseline) / baseline if baseline else None
        figures[key] = {
            "judged_by": judged_by,
            "after_warmup": baseline,
            "at_end": final,
            "growth": None if change is None else round(change, 4),
            "growth_per_hour": None if change is None else round(change / hours, 4),
        }
    return figures


def plot(samples: list[dict], warmup: float, path: Path, title: str) -> None:
    """Six panels over the run's minutes: RSS, open files, database connections, Redis, the
    cores each process used (and the host stole), the engine's mean inter-token latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t"] / 60 for s in samples]
    names = [key.split(".", 1)[1] for key in samples[0] if key.startswith("rss_mb.")]
    cores = psutil.cpu_count() or 1
    stolen = [None if s.get("steal_share") is None else s["steal_share"] * cores for s in samples]
    figure, axes = plt.subplots(3, 2, figsize=(11, 10), sharex=True)
    panels = [
        (axes[0][0], "RSS (MB)", [(n, [s[f"rss_mb.{n}"] for s in samples]) for n in names]),
        (axes[0][1], "open files", [(n, [s[f"open_files.{n}"] for s in samples]) for n in names]),
        (axes[1][0], "database connections", [("PostgreSQL", series(samples, "db_connections"))]),
        (
            axes[1][1],
            "Redis",
            [
                ("used memory (MB)", series(samples, "redis_used_memory_mb")),
                ("keys", series(samples, "redis_keys")),
            ],
        ),
        (
            axes[2][0],
            "cores used",
            [(key.removeprefix("cores."), series(samples, key)) for key in cores_keys(samples)]
            + [("stolen by the host", stolen)],
        ),
        (
            axes[2][1],
            "engine: mean inter-token latency (ms)",
            [("ITL", series(samples, "engine_itl_ms"))],
        ),
    ]
    for axis, label, lines in panels:
        for name, values in lines:
            axis.plot(minutes, [float("nan") if v is None else v for v in values], label=name)
        axis.axvline(warmup / 60, color="grey", linestyle="--", linewidth=0.8)
        axis.set_title(label)
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=7)
    for axis in axes[2]:
        axis.set_xlabel("minutes (dashed: end of warm-up)")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def cores_keys(samples: list[dict]) -> list[str]:
    """The `cores.` series, in the order they first appear."""
    return list(dict.fromkeys(k for s in samples for k in s if k.startswith("cores.")))


def series(samples: list[dict], key: str) -> list:
    """One series over the samples; None where a sample lacks it (the first has no rates)."""
    return [s.get(key) for s in samples]
