"""The soak's sampler: every 10 s, each process's memory and open files, the database's
connections, Redis's memory and keys; then growth after warm-up, and the plot.

Beside them it records what the machine and the engine did over each interval: the cores
each process used, the share of CPU time the host stole, and the engine's tokens/s and mean
inter-token latency (from the web process's /metrics). They are not judged for growth; they
tell a slower host (steal up, the same CPU per token) from a slower engine (ITL up with
nothing stolen) when replies slow down.

Growth compares the median of a series over the first window after warm-up with its median
over the run's last window, so one busy moment (a reply in flight, a connection borrowed)
does not count as growth; a leak moves the median.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import redis
from prometheus_client.parser import text_string_to_metric_families

MB = 1024 * 1024
# Series that describe load over an interval, not what a process holds: never judged.
LOAD_SERIES = ("load_average_1m", "cores.", "steal_share", "engine_")
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
    ) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.processes, self.redis_url = processes, redis_url
        self.db_connections, self.stop, self.interval = db_connections, stop, interval
        self.metrics_url = metrics_url
        self.started = time.monotonic()
        self.samples: list[dict] = []
        self._totals: tuple[float, dict] | None = None

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
        if self._totals is not None:
            row.update(interval_rates(self._totals[1], totals, now - self._totals[0]))
        self._totals = (now, totals)
        row["db_connections"] = self.db_connections()
        with redis.Redis.from_url(self.redis_url, socket_timeout=5) as client:
            row["redis_used_memory_mb"] = round(client.info("memory")["used_memory"] / MB, 2)
            row["redis_keys"] = client.dbsize()
        row["load_average_1m"] = round(psutil.getloadavg()[0], 2)
        return row


def growth(samples: list[dict], warmup: float, window: float) -> dict[str, dict]:
    """Per series: the median of the first window after warm-up, of the last window, and the
    growth between them, in all and per hour between the windows' middles (fractions; None
    when the baseline is 0)."""
    end = samples[-1]["t"]
    first = [s for s in samples if warmup <= s["t"] < warmup + window]
    last = [s for s in samples if s["t"] > end - window]
    hours = statistics.median(s["t"] for s in last) - statistics.median(s["t"] for s in first)
    hours /= 3600
    series = [key for key in samples[0] if key != "t" and not key.startswith(LOAD_SERIES)]
    figures = {}
    for key in series:
        baseline = statistics.median(s[key] for s in first)
        final = statistics.median(s[key] for s in last)
        change = (final - baseline) / baseline if baseline else None
        figures[key] = {
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
            [(n, series(samples, f"cores.{n}")) for n in names] + [("stolen by the host", stolen)],
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


def series(samples: list[dict], key: str) -> list:
    """One series over the samples; None where a sample lacks it (the first has no rates)."""
    return [s.get(key) for s in samples]
