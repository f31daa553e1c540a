"""The KV cache: one preallocated tensor holding every layer's keys and values per slot.

Layout [layers, 2 (K, V), slots, kv_heads, capacity, head_dim]. A running sequence owns one
slot; occupied slots are kept compacted in 0..n-1 (when a sequence leaves, the last slot's
rows move into the hole, once), so decode attention reads the view K[:n, :, :L] with a
length mask and never gathers. Capacity (tokens per slot) and the allocated slot count grow
by doubling, so copies are rare and amortised, and shrink back when use falls to a quarter.

Capacity is one number for every slot, so one long prompt grows all of them: at 2,048
positions the storage is 1.5 GB in bf16 (SmolLM2, 32 slots). Allocated and zeroed inside
the step that needed it, each doubling stalled every decoder (1.1, 3.7 and 2.9 s under load
while a 2,000-token prompt prefilled next to 31 decoders: the whole ITL p99). So a sequence
admitted with a long prompt `reserve`s its length: the storage is allocated and zeroed on a
background thread (torch drops the GIL while it fills) while the prompt's first chunks run,
and the doubling that reaches it only copies each slot's used rows into it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from inference.engine.openmp import release_thread_pool


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
        self.storage = self._allocate(self._min_slots, self._min_capacity)
        self._spare: tuple[int, int, Future[torch.Tensor]] | None = None
        self._allocator: ThreadPoolExecutor | None = None

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
        """Memory the storage tensor takes now."""
        return self.storage.numel() * self.storage.element_size()

    @property
    def max_tokens(self) -> int:
        """Tokens the cache may grow to hold (max slots x max sequence length)."""
        return self.max_slots * self.max_seq_len

    def keys(self, layer: int) -> torch.Tensor:
        """Layer's keys [slots, kv_heads, capacity, head_dim] (a view)."""
        return self.storage[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        """Layer's values [slots, kv_heads, capacity, head_dim] (a view)."""
        return self.storage[layer, 1]

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
        elif 4 * length > 3 * self.capacity:  # decoders near the end: the next doubling
            self.reserve(self.capacity + 1)
        self.lengths[slot] = length

    def reserve(self, length: int) -> None:
        """Start allocating, in the background, the storage a slot reaching `length` needs.

        Nothing to do when the capacity already holds it or a spare that does is on its way.
        `extend` reserves the next doubling itself once a slot is three quarters full.
        """
        capacity = min(self.max_seq_len, _pow2_at_least(length))
        if capacity <= self.capacity:
            return
        spare = self._spare
        if spare is not None and spare[0] == self.allocated_slots and spare[1] >= capacity:
            return
        if self._allocator is None:
            self._allocator = ThreadPoolExecutor(1, thread_name_prefix="tandem-kv")
        slots = self.allocated_slots
        future = self._allocator.submit(self._allocate_apart, slots, capacity)
        self._spare = (slots, capacity, future)

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
        self._spare = None
        self._maybe_shrink()

    def _maybe_shrink(self) -> None:
        """Give memory back once use falls to a quarter of either dimension (hysteresis)."""
        longest = max(self.lengths, default=0)
        slots, capacity = self.allocated_slots, self.capacity
        if 4 * self.num_used <= slots and slots > self._min_slots:
            slots = max(self._min_slots, _pow2_at_least(2 * self.num_used))
        if 4 * longest <= capacity and capacity > self._min_capacity:
            capacity = max(self._min_capacity, _pow2_at_least(2 * longest))
        if (slots, capacity) != (self.allocated_slots, self.capacity):
            self._resize(slots, capacity)

    def _allocate_apart(self, slots: int, capacity: int) -> torch.Tensor:
        """`_allocate` on the background thread, which then lets go of the OpenMP workers the
        zero fill started: kept, they would halve the engine thread's kernels (openmp.py)."""
        try:
            return self._allocate(slots, capacity)
        finally:
            release_thread_pool()

    def _allocate(self, slots: int, capacity: int) -> torch.Tensor:
        # Zeros, not empty: masked positions still meet V in a matmul, and 0 * NaN is NaN.
        spec = self.spec
        shape = (spec.num_layers, 2, slots, spec.num_kv_heads, capacity, spec.head_dim)
        return torch.zeros(shape, dtype=spec.dtype, device=spec.device)

    def _resize(self, slots: int, capacity: int) -> None:
        """Move to storage of `slots` x `capacity` (or the reserved spare, when it is at least
        that big), copying each slot's used rows."""
        spare, self._spare = self._spare, None
        if spare is not None and spare[0] == slots and spare[1] >= capacity > self.capacity:
            storage = spare[2].result()
        else:
            storage = self._allocate(slots, capacity)
        old = self.storage
        for slot, length in enumerate(self.lengths):
            storage[:, :, slot, :, :length] = old[:, :, slot, :, :length]
        self.storage = storage
