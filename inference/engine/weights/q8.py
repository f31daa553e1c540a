"""int8 weights times int8 activations: TANDEM_WEIGHTS=q8, the C++ kernel in `q8_linear.cpp`.

At one row a step is a read of every weight, so bytes per weight set its floor. A float32 model
(the engine's dtype where the CPU has no native bfloat16: AVX2 machines) had fbgemm's fp16 GEMM,
two bytes a weight; torch's int8 weight-only kernel takes bfloat16 rows, which such a CPU
emulates. This kernel reads one byte a weight (symmetric int8 per output row, as TANDEM_WEIGHTS=
int8 rounds them) and rounds each row of activations to int8 per block of 32 with a scale of its
own, llama.cpp's Q8_0 scheme: a block's products are summed in int32 by the CPU's int8 dot
product, so no weight is ever widened to float. Built for the instructions the CPU has (AVX2,
AVX-512BW, AVX-512 VNNI; plain C++ without AVX2, where it is slow and `auto` does not take it).

Its matrices reach the compiled step by handle (`handles.py`), as fbgemm's do, so no bucket's
package holds a copy of them; the op and its registry of matrices are C++ (`q8_linear.cpp`), so
a graph's call runs without taking the GIL, which an HTTP server's event loop holds often.
"""

from __future__ import annotations

from functools import cache

import torch

from inference.engine.native_build import native_module
from inference.engine.weights.handles import Registry

BLOCK = 32


def _released(handle: int) -> None:
    native_module().q8_release(handle)


# handle -> (int8 weight [out, in], float32 scales [out]), also held by the C++ op
_matrices: Registry[tuple[torch.Tensor, torch.Tensor]] = Registry(_released)


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: q in -127..127 and float32 scales, w ≈ q · scale."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return q, scales


def q8_kernel_missing() -> str | None:
    """None when the kernel is built and runs here, else why it does not."""
    try:
        module = native_module()
        x = torch.ones(1, BLOCK)
        module.q8_linear(x, torch.ones(2, BLOCK, dtype=torch.int8), torch.ones(2))
    except (ImportError, OSError, RuntimeError) as exc:  # a failed build is a RuntimeError
        return f"the q8 kernel did not build or run here ({exc})"
    return None


def q8_instructions() -> str:
    """The instructions the kernel was built for: avx512_vnni, avx512bw, avx2 or scalar."""
    return native_module().q8_instructions


@cache
def _op_ready() -> None:
    """The C++ op `tandem::q8_linear(x, handle, out_features)` registered (by loading the
    module) and given its shape function for tracing; once a process."""
    native_module()

    @torch.library.register_fake("tandem::q8_linear")
    def _shape(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
        return x.new_empty(x.shape[0], out_features)


def _registered(handle: int, q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The matrix in the C++ registry under `handle`, and as Python holds it."""
    _op_ready()
    q, scales = q.contiguous(), scales.float().contiguous()
    native_module().q8_register(handle, q, scales)
    return q, scales


class Q8Matrix:
    """One [out, in] weight as int8 rows with float32 scales (no bias: the caller adds it, as
    for the other kernels)."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor) -> None:
        if q.shape[1] % BLOCK:
            raise ValueError(f"q8 takes inputs in blocks of {BLOCK}, not {q.shape[1]}")
        self.out_features, self.in_features = q.shape
        self.handle, (self.q, self.scales) = _matrices.hold(
            self, [q, scales], lambda handle: _registered(handle, q, scales)
        )

    def dequantize(self) -> torch.Tensor:
        """float32 [out, in]: the weights this kernel multiplies by."""
        return self.q.float() * self.scales[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in x's dtype (float32 or bfloat16)."""
        if torch.compiler.is_compiling():
            return torch.ops.tandem.q8_linear(x, self.handle, self.out_features)
        return native_module().q8_linear(x.contiguous(), self.q, self.scales)
