"""The KV cache: one preallocated tensor holding every layer's keys and values per slot.

Layout [layers, 2 (K, V), slots, kv_heads, capacity, head_dim]. A running sequence owns one
slot; occupied slots are kept compacted in 0..n-1 (when a sequence leaves, the last slot's
rows move into the hole, once), so decode attention reads the view K[:n, :, :L] with a
length mask and never gathers. Capacity (tokens per slot) and the allocated slot count grow
by doubling, so copies are rare and amortised, and shrink back when use falls to a quarter
(on the CPU, once the cache is empty: see `_maybe_shrink`).

Capacity is one number for every slot, so one long prompt grows all of them: at 2,048
positions the storage is 1.5 GB in bf16 (SmolLM2, 32 slots). Zero-filled up front
(`torch.zeros`), each doubling stalled every decoder: 1.1, 3.7 and 2.9 s under load inside
the step, and still 150-215 ms steps for seconds when the fill ran on a thread of its own (it
took a core from the engine's two, 1.9 s for 1.5 GB). On the CPU the storage is therefore
fresh anonymous memory: the kernel hands out zero pages as they are first touched, so
growing costs the copy of each slot's used rows, not a fill of the whole tensor, and the
memory in use follows the positions written. A sequence admitted with a long prompt
`reserve`s its whole length, one growth instead of a doubling per chunk.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch

from inference.engine.page_ahead import PageAhead


@dataclass(frozen=True)
class KVSpec:
    """The shape and placement of a model's keys and values."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class KVCache:
    """Slots of cached K/V with per-slot used-token accounting.

    Only the engine thread touches it. `lengths[s]` is how many positions of slot s hold
    valid K/V (after the step being planned); positions beyond are stale and masked.
    """

    def __init__(
        self, spec: KVSpec, max_slots: int, max_seq_len: int, initial_capacity: int = 256
    ) -> None:
        self.spec = spec
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self._min_capacity = min(initial_capacity, max_seq_len)
        self._min_slots = min(4, max_slots)
        self.lengths: list[int] = []
        self.pages = PageAhead() if spec.device.type == "cpu" else None
        self.storage = self._allocate(self._min_slots, self._min_capacity)

    @property
    def num_used(self) -> int:
        """Occupied slots (they are 0..num_used-1)."""
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        """Positions allocated per slot."""
        return self.storage.shape[4]

    @property
    def allocated_slots(self) -> int:
        """Slots allocated in the storage tensor."""
        return self.storage.shape[2]

    @property
    def used_tokens(self) -> int:
        """Cached tokens across all slots."""
        return sum(self.lengths)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the current allocation can hold."""
        return self.allocated_slots * self.capacity

    @property
    def allocated_bytes(self) -> int:
        """Bytes the storage spans (on the CPU, pages never written take no memory)."""
        return self.storage.numel() * self.storage.element_size()

    @property
    def max_tokens(self) -> int:
        """Tokens the cache may grow to hold (max slots x max sequence length)."""
        return self.max_slots * self.max_seq_len

    def layer(self, layer: int) -> torch.Tensor:
        """Layer's keys and values [2, slots, kv_heads, capacity, head_dim] (a view)."""
        return self.storage[layer]

    def keys(self, layer: int) -> torch.Tensor:
        """Layer's keys [slots, kv_heads, capacity, head_dim] (a view)."""
        return self.storage[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        """Layer's values [slots, kv_heads, capacity, head_dim] (a view)."""
        return self.storage[layer, 1]

    def fault_ahead(self) -> None:
        """Once a step: fault in the next pages of the slot nearest its populated end
        (`page_ahead.py`; CPU storage only)."""
        if self.pages is not None:
            self.pages.step(self.storage, self.lengths)

    def allocate(self) -> int:
        """Take the next free slot, with no tokens yet."""
        if self.num_used >= self.max_slots:
            raise RuntimeError("KV cache has no free slot")
        if self.num_used == self.allocated_slots:
            self._resize(min(self.max_slots, 2 * self.allocated_slots), self.capacity)
        self.lengths.append(0)
        return self.num_used - 1

    def extend(self, slot: int, length: int) -> None:
        """Record that `slot` will hold `length` tokens after this step, growing if needed."""
        if length > self.max_seq_len:
            raise RuntimeError(f"sequence of {length} tokens exceeds {self.max_seq_len}")
        if length > self.capacity:
            capacity = min(self.max_seq_len, max(2 * self.capacity, _pow2_at_least(length)))
            self._resize(self.allocated_slots, capacity)
        self.lengths[slot] = length

    def reserve(self, length: int) -> None:
        """Grow now to hold a slot of `length` positions (a long prompt's whole length): one
        copy of every slot's rows, where its chunks would each have doubled the storage."""
        capacity = min(self.max_seq_len, _pow2_at_least(length))
        if capacity > self.capacity:
            self._resize(self.allocated_slots, capacity)

    def free(self, slot: int) -> int | None:
        """Release a slot at once. Returns the old index of the slot moved into the hole.

        The last occupied slot's rows are copied into `slot` (one copy across all layers),
        keeping slots compacted; the caller re-points that sequence to `slot`.
        """
        last = self.num_used - 1
        moved: int | None = None
        if slot != last:
            length = self.lengths[last]
            self.storage[:, :, slot, :, :length] = self.storage[:, :, last, :, :length]
            self.lengths[slot] = length
            moved = last
        self.lengths.pop()
        self._maybe_shrink()
        return moved

    def reset(self) -> None:
        """Free every slot at once (recovery after a fault)."""
        self.lengths.clear()
        self._maybe_shrink()

    def _maybe_shrink(self) -> None:
        """Give memory back once use falls to a quarter of either dimension (hysteresis).

        On the CPU only once the cache is empty: positions never written in fresh zero pages
        take no memory, while a shrink copies every used row into new pages on the engine
        thread. When a 2,000-token prompt left 31 decoders at ~130 positions, that copy made
        one step 503 ms against their 90 (docs/benchmarks.md): every decoder's token waited.
        """
        if self.spec.device.type == "cpu" and self.lengths:
            return
        longest = max(self.lengths, default=0)
        slots, capacity = self.allocated_slots, self.capacity
        if 4 * self.num_used <= slots and slots > self._min_slots:
            slots = max(self._min_slots, _pow2_at_least(2 * self.num_used))
        if 4 * longest <= capacity and capacity > self._min_capacity:
            capacity = max(self._min_capacity, _pow2_at_least(2 * longest))
        if (slots, capacity) != (self.allocated_slots, self.capacity):
            self._resize(slots, capacity)

    def _allocate(self, slots: int, capacity: int) -> torch.Tensor:
        # Zeros, not empty: masked positions still meet V in a matmul, and 0 * NaN is NaN.
        spec = self.spec
        shape = (spec.num_layers, 2, slots, spec.num_kv_heads, capacity, spec.head_dim)
        if self.pages is None:
            return torch.zeros(shape, dtype=spec.dtype, device=spec.device)
        self.pages.reset(self.lengths, slots)
        return zero_pages(shape, spec.dtype)

    def _resize(self, slots: int, capacity: int) -> None:
        """Move to storage of `slots` x `capacity`, copying each slot's used rows."""
        storage = self._allocate(slots, capacity)
        old = self.storage
        for slot, length in enumerate(self.lengths):
            storage[:, :, slot, :, :length] = old[:, :, slot, :, :length]
        self.storage = storage


def zero_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor on fresh anonymous memory, nothing filled: pages are zero when first
    touched and only those take memory. Small pages (MADV_NOHUGEPAGE): a 2 MB huge page
    would be zeroed whole by the first write to any of its positions."""
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    memory = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.frombuffer(memory, dtype=torch.uint8, count=size).view(dtype).view(shape)
