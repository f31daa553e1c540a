"""The soak's sampler: every 10 s, each process's memory and open files, the database's
connections, Redis's memory and keys; then growth after warm-up, and the plot.

Growth compares the median of a series over the first window after warm-up with its median
over the run's last window, so one busy moment (a reply in flight, a connection borrowed)
does not count as growth; a leak moves the median.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import redis

MB = 1024 * 1024


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and its children (a Celery worker's pool processes), alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_figures(pid: int) -> tuple[float, int]:
    """RSS in MB and open file descriptors, summed over the process and its children."""
    rss, files = 0, 0
    for process in process_tree(pid):
        try:
            rss += process.memory_info().rss
            files += process.num_fds()
        except psutil.NoSuchProcess:
            continue
    return round(rss / MB, 1), files


class Sampler(threading.Thread):
    """Samples every `interval` seconds until `stop` is set; `samples` holds the rows."""

    def __init__(
        self,
        processes: dict[str, int],
        redis_url: str,
        db_connections: Callable[[], int],
        stop: threading.Event,
        interval: float = 10.0,
    ) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.processes, self.redis_url = processes, redis_url
        self.db_connections, self.stop, self.interval = db_connections, stop, interval
        self.started = time.monotonic()
        self.samples: list[dict] = []

    def run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self.stop.wait(self.interval):
                return

    def sample(self) -> dict:
        row: dict = {"t": round(time.monotonic() - self.started, 1)}
        for name, pid in self.processes.items():
            row[f"rss_mb.{name}"], row[f"open_files.{name}"] = tree_figures(pid)
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
    series = [key for key in samples[0] if key not in ("t", "load_average_1m")]
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
    """Four panels over the run's minutes: RSS, open files, database connections, Redis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s["t"] / 60 for s in samples]
    names = [key.split(".", 1)[1] for key in samples[0] if key.startswith("rss_mb.")]
    figure, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    panels = [
        (axes[0][0], "RSS (MB)", [(n, f"rss_mb.{n}") for n in names]),
        (axes[0][1], "open files", [(n, f"open_files.{n}") for n in names]),
        (axes[1][0], "database connections", [("PostgreSQL", "db_connections")]),
        (
            axes[1][1],
            "Redis",
            [("used memory (MB)", "redis_used_memory_mb"), ("keys", "redis_keys")],
        ),
    ]
    for axis, label, lines in panels:
        for name, key in lines:
            axis.plot(minutes, [s[key] for s in samples], label=name)
        axis.axvline(warmup / 60, color="grey", linestyle="--", linewidth=0.8)
        axis.set_title(label)
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=7)
    for axis in axes[1]:
        axis.set_xlabel("minutes (dashed: end of warm-up)")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
