"""Pages of the CPU KV cache faulted in ahead of the positions decoders will write, one slot a step.

The storage is fresh zero pages (`kv_cache.zero_pages`): a page takes memory, and costs a page
fault, when first written. A 4 KiB page holds 32 positions of one (layer, K or V, slot, head)
row in bfloat16 (16 under a float32 model), so a decoder
faults 180 pages (SmolLM2: 30 layers x 2 x 3 heads) every 32 (16) tokens; and
requests that started together cross those boundaries in the same step. With 31 decoders
that was one step in 32 costing 130-196 ms against 75-100 (5,580 faults in one step, the
head-of-line bench's p99; docs/benchmarks.md). Here each step faults in the next pages of at
most one slot, the one closest to its populated end, with `MADV_POPULATE_WRITE` (Linux 5.14;
it faults pages in without touching what they hold): the same work, spread over the steps
before it is needed. Where the call is refused (an older kernel, another OS) nothing is done
and the writes fault as before.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os

import torch

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23
# Positions faulted in per slot at a time, and how close to its populated end a slot's
# length may come before it is topped up: 32 decoders crossing together are all served
# within 32 steps of 96 positions' notice.
WINDOW = 128
MARGIN = 96


class PageAhead:
    """Per slot, how far its pages are known faulted in; `step` tops up the most urgent."""

    def __init__(self) -> None:
        self.populated: list[int] = []
        self.enabled = True
        self._madvise = _madvise()

    def reset(self, lengths: list[int], slots: int) -> None:
        """New storage: only the rows copied into it (each slot's used ones) are in."""
        self.populated = list(lengths) + [0] * (slots - len(lengths))

    def step(self, storage: torch.Tensor, lengths: list[int]) -> None:
        """Fault in the next WINDOW positions of the slot closest to its populated end,
        if it is within MARGIN of it."""
        if not self.enabled or not lengths:
            return
        slot = min(range(len(lengths)), key=lambda s: self.populated[s] - lengths[s])
        start, length = self.populated[slot], lengths[slot]
        if start - length >= MARGIN:
            return
        capacity = storage.shape[4]
        end = min(capacity, length + WINDOW)
        if end > start and not self._populate(storage, slot, start, end):
            return
        self.populated[slot] = max(start, end)

    def _populate(self, storage: torch.Tensor, slot: int, start: int, end: int) -> bool:
        """MADV_POPULATE_WRITE over positions [start, end) of every row of `slot`."""
        layers, halves, _, heads, capacity, dim = storage.shape
        row = dim * storage.element_size()
        page = mmap.PAGESIZE
        for layer in range(layers):
            for half in range(halves):
                base = storage[layer, half, slot].data_ptr()
                for head in range(heads):
                    first = base + (head * capacity + start) * row
                    last = base + (head * capacity + end) * row
                    aligned = first - first % page
                    if self._madvise(aligned, last - aligned) != 0:
                        self.enabled = False
                        log.info("KV pages are faulted in on first write: %s", _errno())
                        return False
        return True


def _madvise():
    """libc's madvise(addr, length, MADV_POPULATE_WRITE), called without the GIL (ctypes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):
        return lambda address, length: -1
    call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    call.restype = ctypes.c_int
    return lambda address, length: call(address, length, MADV_POPULATE_WRITE)


def _errno() -> str:
    return os.strerror(ctypes.get_errno())
