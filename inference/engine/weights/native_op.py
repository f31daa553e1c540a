"""A weight kernel of the C++ module (`q8_linear`, `q4_1_linear`) with its matrices by handle.

Its matrices reach the compiled step by handle (`handles.py`), as fbgemm's do, so no bucket's
package holds a copy of them; the op and its registry of matrices are C++, so a graph's call
runs without taking the GIL, which an HTTP server's event loop holds often.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

from inference.engine.native_build import native_module
from inference.engine.weights.handles import Registry


@cache
def linear_op(kernel: str) -> Callable:
    """The C++ op `tandem::<kernel>_linear`, registered by loading the module, given its shape
    function for tracing; once a process."""
    native_module()

    @torch.library.register_fake(f"tandem::{kernel}_linear")
    def _shape(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)

    return getattr(torch.ops.tandem, f"{kernel}_linear")


class NativeOp:
    """`tandem::<kernel>_linear(x, handle, out_features)` and the module's `<kernel>_linear(x,
    *tensors)`, `<kernel>_register(handle, *tensors)` and `<kernel>_release(handle)`."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel
        self.matrices: Registry[tuple[torch.Tensor, ...]] = Registry(self._released)

    def _function(self, verb: str) -> Callable:
        return getattr(native_module(), f"{self.kernel}_{verb}")

    def _released(self, handle: int) -> None:
        self._function("release")(handle)

    def hold(self, owner: object, tensors: list[torch.Tensor]) -> tuple[int, tuple]:
        """The handle of `tensors` (contiguous, registered in C++ once per content), released
        with `owner`, and the tensors as the registry keeps them."""

        def registered(handle: int) -> tuple[torch.Tensor, ...]:
            linear_op(self.kernel)  # registered before a graph can name it
            kept = tuple(tensor.contiguous() for tensor in tensors)
            self._function("register")(handle, *kept)
            return kept

        return self.matrices.hold(owner, tensors, registered)

    def __call__(
        self, x: torch.Tensor, handle: int, out_features: int, tensors: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in x's dtype (float32 or bfloat16): the opaque op when a
        graph is traced, the module's function (no dispatcher) when called eagerly."""
        if torch.compiler.is_compiling():
            return linear_op(self.kernel)(x, handle, out_features)
        return self._function("linear")(x.contiguous(), *tensors)
