"""Handing the CPU's OpenMP workers to the engine thread.

torch's CPU kernels run on GNU OpenMP (libgomp), which keeps a pool of worker threads per
thread that ever started a parallel region, and keeps every idle worker alive. Between
parallel regions a worker spins briefly before it sleeps, but only while the process has no
more workers than CPUs; past that it sleeps at once and each of the step's ~150 small
parallel regions pays a futex wake-up. A thread that loaded the model (and measured the
kernels) leaves its pool behind, so on a 2-CPU machine the engine thread's two-thread
kernels ran at half speed: a one-row compiled q4 step took 20.5 ms from the engine thread
against 9.5 ms from the thread that loaded (docs/engine.md, "Threads"). Releasing the
loader's pool brings the engine thread's step back to 12 ms. The engine releases its own
pool when it goes idle, for the same reason the other way round: the benchmarks' peers run
their kernels on the main thread while the engine waits.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1


@cache
def _libgomp() -> ctypes.CDLL | None:
    """The libgomp torch loaded (not a second copy from the system), or None."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            path = next((line.split()[-1] for line in maps if "libgomp" in line), None)
    except OSError:
        return None
    if path is None:
        return None
    library = ctypes.CDLL(path)
    return library if hasattr(library, "omp_pause_resource_all") else None


def release_thread_pool() -> bool:
    """Free the calling thread's idle OpenMP workers; False where torch does not use libgomp.

    Safe to call from any thread outside a parallel region: a later torch call from the
    same thread builds its pool again.
    """
    library = _libgomp()
    if library is None:
        return False
    released = library.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
    if not released:
        log.debug("libgomp refused to release this thread's pool")
    return released
