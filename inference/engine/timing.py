"""Timing a call at start, to seed a choice or a budget: the fastest of a few runs.

Other work on a shared machine only ever adds time, so the fastest run is the call's own cost;
with the median, one start on a 2-core AMD EPYC (2026-12-03) read int8 as losing at one row,
where it wins by 3-4x, and ran bf16.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def fastest_seconds(
    run: Callable[[], object], repeats: int, before: Callable[[], object] | None = None
) -> float:
    """Seconds of the fastest of `repeats` calls of `run`, each after an untimed `before`."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)
