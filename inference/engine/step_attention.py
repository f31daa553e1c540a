"""The attention op a step's graph calls between its layers: C++ where the module is built.

`tandem::step_attention` (step_attention.cpp) runs the commonest step, decode rows in slots
0..n-1 read through one view of the cache, without the GIL: as a Python op each of a step's 30
calls cost ~60 µs of Python around its kernel, and in a web process waited for the GIL while
the event loop held it. Any other step (prompt chunks, rows gathered apart, the Python
attention kernels), or one a newcomer may cut into (`ArrivalFlag` set), calls the step's
Python `attend`, as the Python op `tandem::decode_attention` (compiled_decode.py) does until
the module is loaded or where it cannot be built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from types import ModuleType

import torch

from inference.engine.native_build import native_module


@dataclass(frozen=True, slots=True)
class ViewStep:
    """What the C++ op needs for a view step, worked out once a step (model_runner.py)."""

    storage: torch.Tensor  # the cache [layers, 2, slots, kv_heads, capacity, head_dim]
    cache_rows: torch.Tensor  # the rows' K/V rows in a layer viewed [-1, head_dim]
    mask: torch.Tensor  # additive [span, 1, 1, longest]
    span: int
    longest: int
    groups: int
    scale: float


class ArrivalFlag:
    """Whether a request was submitted since the engine last planned a step.

    The engine sets and clears it under its lock. Once the C++ module is loaded a C++ twin
    (`native`) follows it, which the op reads between layers without the GIL; made then, not
    at the engine's start, so an engine never waits for the module's build."""

    def __init__(self) -> None:
        self._set = False
        self._native: object | None = None

    def set(self) -> None:
        self._set = True
        native = self._native
        if native is not None:
            native.set()

    def clear(self) -> None:
        self._set = False
        native = self._native
        if native is not None:
            native.clear()

    def is_set(self) -> bool:
        return self._set

    def native(self, module: ModuleType) -> object:
        """The C++ twin, made on first use; a `set` racing with its making is set again."""
        if self._native is None:
            twin = module.ArrivalFlag()
            self._native = twin
            if self._set:
                twin.set()
        return self._native


def loaded_module() -> ModuleType | None:
    """The C++ module if this process has loaded it (the runner loads it with its kernels),
    else None: nothing here waits for a build."""
    if native_module.cache_info().currsize == 0:
        return None
    return native_module()


def step_op() -> Callable | None:
    """`tandem::step_attention` once the module is loaded, else None (the Python op then)."""
    return None if loaded_module() is None else _registered_op()


@cache
def _registered_op() -> Callable:
    """The C++ op with its shape function for tracing; once a process."""

    @torch.library.register_fake("tandem::step_attention")
    def _shape(q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        return q.new_empty(q.shape)

    return torch.ops.tandem.step_attention


def is_native_kernel(kernel: object) -> bool:
    """Whether `kernel` is the module's decode kernel, the one the C++ op calls itself."""
    module = loaded_module()
    return module is not None and kernel is module.decode_attention


@contextmanager
def step_context(
    rows: int,
    python: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    arrivals: ArrivalFlag | None,
    view: ViewStep | None,
) -> Iterator[None]:
    """The C++ op's context for one step on this thread (a no-op without the module): `rows`
    real rows, `python` the Python op's body, `arrivals` the engine's flag when a newcomer
    may cut in, `view` for a view step."""
    module = loaded_module()
    if module is None:
        yield
        return
    native = None if arrivals is None else arrivals.native(module)
    if view is None:
        module.step_begin(rows, python, native)
    else:
        module.step_begin_view(
            rows,
            python,
            native,
            view.storage,
            view.cache_rows,
            view.mask,
            view.span,
            view.longest,
            view.groups,
            view.scale,
        )
    try:
        yield
    finally:
        module.step_end()
