"""Freed heap memory kept for the next step, not handed back to the system and faulted in again.

glibc's malloc gives a freed block back to the system when it ends the heap past a trim
threshold, or serves a large request with its own mapping and unmaps it when freed; it
raises both thresholds as it sees large blocks freed, up to a point. Every step allocates
blocks of megabytes (a 32-row step's logits are 6.3 MB of float32, its log-softmax as
much again), so the engine thread's arena was trimmed and grown step after step: in a
32-stream burst (2-core AMD EPYC, 2026-12-02) most steps' log-softmax faulted in 769 fresh
pages and took 1.7-2.2 ms (up to 12 ms) against 0.55 ms on memory already mapped. Fixed
thresholds (which also stop glibc from moving them) keep what a step freed for the next:
blocks up to MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of free memory at
its end stays mapped. The process keeps its high-water mark of freed heap, which the
engine reaches again next step anyway.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest on 64-bit (half a thread arena's heap)
TRIM_THRESHOLD = 256 * 1024 * 1024


@cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; False where malloc is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    kept = (
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    )
    if not kept:
        log.info("malloc refused fixed thresholds: freed step memory may be faulted in again")
    return kept
