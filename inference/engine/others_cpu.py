"""How much CPU other processes took while this one measured something.

A start-up measurement (the weights' crossover) is kept only when nothing else ran beside it
(`CompileCache.measured`). The load average cannot say so: it lags by a minute, and it counts
the measurement's own threads, which keep every core busy for the minutes it runs, so a
2-thread measurement on a 2-core machine read as busy however quiet the machine was, and
nothing was kept (2-core Xeon with AMX, 2026-12-07: the next start measured again and built
every bucket). Here the machine's busy time over the span, less this process's own CPU time,
is what the others took.
"""

from __future__ import annotations

import time

import psutil

# Others may take this much of one CPU, on average over the span, for it to count as quiet:
# a quiet machine's daemons take a few hundredths; a test suite or a build beside it, one
# CPU or more.
QUIET_CPUS = 0.5


def _busy_seconds() -> float:
    """CPU seconds the machine has spent not idle, stolen time included (a neighbour on the
    host slows a measurement as much as a process here does)."""
    times = psutil.cpu_times()
    # Linux counts a guest's time in user time too, and iowait is idle.
    not_busy = ("idle", "iowait", "guest", "guest_nice")
    return sum(times) - sum(getattr(times, name, 0.0) for name in not_busy)


def _own_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


class OthersCpu:
    """Started when made; `cpus()` is the CPUs, on average, that other processes have used
    since then."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._busy = _busy_seconds()
        self._own = _own_seconds()

    def cpus(self) -> float:
        elapsed = time.monotonic() - self._started
        if elapsed <= 0:
            return 0.0
        others = (_busy_seconds() - self._busy) - (_own_seconds() - self._own)
        return max(0.0, others / elapsed)

    def quiet(self) -> bool:
        return self.cpus() < QUIET_CPUS
