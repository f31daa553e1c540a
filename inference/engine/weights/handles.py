"""Packed matrices the compiled step names by a number.

A packing that is no tensor (fbgemm's fp16 matrix) cannot be a graph constant, and one that is
(q8's int8 rows) would be copied into every bucket's package (compile_cache.py). So the graph
calls an opaque op with a handle into a registry of this process. The handle is drawn from the
bytes the packing is built from, so a graph stored on disk names the same matrix in the next
process; two owners of the same bytes share one packing, which leaves the registry with its
last owner.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

Packed = TypeVar("Packed")


class Registry(Generic[Packed]):
    """handle -> packing, counted by owner. `on_release(handle)` runs as the last owner goes
    (a packing registered in C++ as well leaves it there)."""

    def __init__(self, on_release: Callable[[int], None] | None = None) -> None:
        self._entries: dict[int, list] = {}  # handle -> [packing, owners]
        self._on_release = on_release

    def hold(
        self, owner: object, sources: list[torch.Tensor], build: Callable[[int], Packed]
    ) -> tuple[int, Packed]:
        """The handle and packing for `sources`' bytes, built once (`build(handle)`); released
        with `owner`."""
        digest = hashlib.blake2b(digest_size=7)
        for tensor in sources:
            digest.update(tensor.contiguous().view(torch.uint8).numpy().data)
        handle = int.from_bytes(digest.digest(), "little")
        entry = self._entries.get(handle)
        if entry is None:
            entry = self._entries[handle] = [build(handle), 0]
        entry[1] += 1
        weakref.finalize(owner, self._release, handle)
        return handle, entry[0]

    def __getitem__(self, handle: int) -> Packed:
        return self._entries[handle][0]

    def __contains__(self, handle: int) -> bool:
        return handle in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def _release(self, handle: int) -> None:
        entry = self._entries[handle]
        entry[1] -= 1
        if entry[1] == 0:
            del self._entries[handle]
            if self._on_release is not None:
                self._on_release(handle)
