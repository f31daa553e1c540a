"""The KV cache: one preallocated tensor holding every layer's keys and values per slot.

Layout [layers, 2 (K, V), slots, kv_heads, capacity, head_dim]. A running sequence owns one
slot; occupied slots are kept compacted in 0..n-1 (when a sequence leaves, the last slot's
rows move into the hole, once), so decode attention reads the view K[:n, :, :L] with a
length mask and never gathers. On an accelerator, capacity (tokens per slot) and the
allocated slot count grow by doubling, so copies are rare and amortised, and shrink back
when use falls to a quarter.

On the CPU the storage is fresh anonymous memory mapped once at its full size (every slot,
the whole sequence length: the engine asks for that): the kernel hands out zero pages as
they are first touched, so the mapping costs nothing up front and the memory in use follows
the positions written. Zero-filled and grown by doubling, as on an accelerator, each growth
stalled every decoder: 1.1, 3.7 and 2.9 s under load inside the step, and a shrink's copy of
31 slots' rows made one step 503 ms against their 90 (docs/benchmarks.md). Written pages
stay while the engine works: a page given back when the cache empties was faulted in again
by the next requests, ~2.4 µs a page, 180 pages per 16 positions of a slot (SmolLM2, float32).
They go back to the system only when the engine has been idle a while (`release_pages`).

A freed slot's rows stay where they are until the slot is taken again, and the cache keeps
which token ids they hold (`free`'s `kept`). A new prompt that starts with tokens a free slot holds
(the chat template's system prompt, a conversation's earlier turns) takes them instead of
prefilling them again (`allocate_prefix`): positions depend only on the tokens before them,
so those rows are what its prefill would write.
"""

from __future__ import annotations

import itertools
import math
import mmap
from collections.abc import Sequence
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
        self,
        spec: KVSpec,
        max_slots: int,
        max_seq_len: int,
        initial_capacity: int = 256,
        initial_slots: int = 4,
        fresh_pages: bool | None = None,
    ) -> None:
        """`fresh_pages`: storage on fresh anonymous memory, kept whole while the engine
        works (None: on the CPU); else zero-filled and grown and shrunk by doubling."""
        self.spec = spec
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self._min_capacity = min(initial_capacity, max_seq_len)
        self._min_slots = min(initial_slots, max_slots)
        self.lengths: list[int] = []
        if fresh_pages is None:
            fresh_pages = spec.device.type == "cpu"
        self.pages = PageAhead() if fresh_pages else None
        self._memory: mmap.mmap | None = None
        self._pages_held = False
        # Free slot -> the token ids its rows hold from positions 0 on (`free`'s `kept`).
        self.kept: dict[int, list[int]] = {}
        # Bumped whenever a slot's rows move or the storage is replaced: a step planned
        # before a bump would address stale rows (a step that a newcomer's ran inside).
        self.layout_version = 0
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
        self.kept.pop(self.num_used - 1, None)
        return self.num_used - 1

    def allocate_prefix(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """`allocate`, with the longest start of `token_ids` that a free slot holds already in
        place (copied in when another free slot holds it): (slot, positions held). The last
        token is never taken: its step must compute the logits that pick the next one."""
        source, held = -1, 0
        for slot, kept in self.kept.items():
            shared = _shared_prefix(kept, token_ids, len(token_ids) - 1)
            if shared > held:
                source, held = slot, shared
        slot = self.num_used
        if len(self.kept.get(slot, ())) > (held if slot == source else 0):
            self._save_kept(slot)
        slot = self.allocate()
        if held and source != slot:
            self.storage[:, :, slot, :, :held] = self.storage[:, :, source, :, :held]
        return slot, held

    def _save_kept(self, slot: int) -> None:
        """Copy the rows free `slot` keeps into a free slot that keeps none, if there is one:
        the slot is about to be taken and written past what the new prompt shares with it,
        and a conversation's rows should outlive other requests."""
        empty = next(
            (s for s in range(self.num_used + 1, self.allocated_slots) if s not in self.kept),
            None,
        )
        if empty is not None:
            ids = self.kept.pop(slot)
            self.storage[:, :, empty, :, : len(ids)] = self.storage[:, :, slot, :, : len(ids)]
            self.kept[empty] = ids

    def extend(self, slot: int, length: int) -> None:
        """Record that `slot` will hold `length` tokens after this step, growing if needed."""
        if length > self.max_seq_len:
            raise RuntimeError(f"sequence of {length} tokens exceeds {self.max_seq_len}")
        if length > self.capacity:
            capacity = min(self.max_seq_len, max(2 * self.capacity, _pow2_at_least(length)))
            self._resize(self.allocated_slots, capacity)
        self.lengths[slot] = length
        self._pages_held = True

    def reserve(self, length: int) -> None:
        """Grow now to hold a slot of `length` positions (a long prompt's whole length): one
        copy of every slot's rows, where its chunks would each have doubled the storage."""
        capacity = min(self.max_seq_len, _pow2_at_least(length))
        if capacity > self.capacity:
            self._resize(self.allocated_slots, capacity)

    def free(self, slot: int, kept: list[int] | None = None) -> int | None:
        """Release a slot at once. Returns the old index of the slot moved into the hole.

        The last occupied slot's rows are copied into `slot` (one copy across all layers),
        keeping slots compacted; the caller re-points that sequence to `slot`. The last
        slot's index becomes free with its rows in place: `kept`, the token ids they hold
        (the moved sequence's, or those of `slot`'s own when it was the last), lets a later
        prompt that starts with them take them (`allocate_prefix`).
        """
        last = self.num_used - 1
        moved: int | None = None
        if slot != last:
            length = self.lengths[last]
            self.storage[:, :, slot, :, :length] = self.storage[:, :, last, :, :length]
            self.lengths[slot] = length
            moved = last
            self.layout_version += 1
        self.lengths.pop()
        if kept:
            self.kept[last] = kept
        self._maybe_shrink()
        return moved

    def reset(self) -> None:
        """Free every slot at once (recovery after a fault), forgetting what they held."""
        self.lengths.clear()
        self.kept.clear()
        self._maybe_shrink()

    @property
    def holds_pages(self) -> bool:
        """Whether the CPU storage has pages written since it was mapped or released."""
        return self._memory is not None and self._pages_held

    def release_pages(self) -> bool:
        """Give an empty CPU cache's written pages back to the system (they read as zeros
        again and are faulted in anew when written), but the kept rows of free slots (a
        conversation's, for its next turn: a few hundred KB each); False when there is
        nothing to give or a sequence still holds a slot."""
        if self.lengths or not self.holds_pages:
            return False
        for start, end in self._spans_not_kept():
            self._memory.madvise(mmap.MADV_DONTNEED, start, end - start)
        self._pages_held = False
        self.pages.reset([], self.allocated_slots)
        return True

    def _spans_not_kept(self) -> list[tuple[int, int]]:
        """Page-aligned byte spans of the storage outside the kept rows, in address order."""
        layers, halves, slots, heads, capacity, dim = self.storage.shape
        row = dim * self.storage.element_size()
        page = mmap.PAGESIZE
        spans, position = [], 0
        for layer, half, slot in itertools.product(range(layers), range(halves), range(slots)):
            held = len(self.kept.get(slot, ()))
            for head in range(heads if held else 0):
                block = ((((layer * halves + half) * slots + slot) * heads + head) * capacity) * row
                keep_start = block - block % page
                if keep_start > position:
                    spans.append((position, keep_start))
                position = max(position, -(-(block + held * row) // page) * page)
        total = len(self._memory)
        if total > position:
            spans.append((position, total))
        return spans

    def _maybe_shrink(self) -> None:
        """Give memory back once use falls to a quarter of either dimension (hysteresis).

        Not on fresh pages (the CPU): there a shrink would copy the used rows into new
        pages on the engine thread, while unwritten positions take no memory anyway;
        `release_pages` gives the written ones back once the engine is idle.
        """
        if self.pages is not None:
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
        self._memory, storage = zero_pages(shape, spec.dtype)
        return storage

    def _resize(self, slots: int, capacity: int) -> None:
        """Move to storage of `slots` x `capacity`, copying each slot's used rows and the
        kept rows of free slots that still fit."""
        storage = self._allocate(slots, capacity)
        old = self.storage
        self.kept = {s: ids[:capacity] for s, ids in self.kept.items() if s < slots}
        rows = dict(enumerate(self.lengths)) | {s: len(ids) for s, ids in self.kept.items()}
        for slot, length in rows.items():
            storage[:, :, slot, :, :length] = old[:, :, slot, :, :length]
        self.storage = storage
        self.layout_version += 1


def _shared_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens a and b share, at most `limit`. A conversation's next prompt
    holds its earlier turns whole: one slice comparison (C speed) answers that case."""
    limit = max(min(len(a), len(b), limit), 0)
    if a[:limit] == b[:limit]:
        return limit
    n = 0  # they differ before `limit`
    while a[n] == b[n]:
        n += 1
    return n


def zero_pages(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[mmap.mmap, torch.Tensor]:
    """A zero tensor on fresh anonymous memory, and that memory; nothing filled: pages are
    zero when first touched and only those take memory. No swap is reserved for the span
    (MAP_NORESERVE: the full-size CPU cache spans gigabytes it mostly never touches), and
    small pages (MADV_NOHUGEPAGE): a 2 MB huge page would be zeroed whole by the first
    write to any of its positions."""
    size = math.prod(shape) * dtype.itemsize
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    memory = mmap.mmap(-1, max(size, 1), flags=flags)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    tensor = torch.frombuffer(memory, dtype=torch.uint8, count=size).view(dtype).view(shape)
    return memory, tensor
