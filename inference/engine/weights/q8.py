"""int8 weights times int8 activations: TANDEM_WEIGHTS=q8, the C++ kernel in `q8_linear.cpp`.

At one row a step is a read of every weight, so bytes per weight set its floor. A float32 model
(the engine's dtype where the CPU has no native bfloat16: AVX2 machines) had fbgemm's fp16 GEMM,
two bytes a weight; torch's int8 weight-only kernel takes bfloat16 rows, which such a CPU
emulates. This kernel reads one byte a weight (symmetric int8 per output row, as TANDEM_WEIGHTS=
int8 rounds them) and rounds each row of activations to int8 per block of 32 with a scale of its
own, llama.cpp's Q8_0 scheme: a block's products are summed in int32 by the CPU's int8 dot
product, so no weight is ever widened to float. Built for the instructions the CPU has (AVX2,
AVX-512BW, AVX-512 VNNI; plain C++ without AVX2, where it is slow and `auto` does not take it).
Its matrices are called by handle (`native_op.py`).
"""

from __future__ import annotations

import torch

from inference.engine.native_build import native_module
from inference.engine.weights.native_op import NativeOp

BLOCK = 32
# handle -> (int8 weight [out, in], float32 scales [out]), also held by the C++ op
OP = NativeOp("q8")


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


class Q8Matrix:
    """One [out, in] weight as int8 rows with float32 scales (no bias: the caller adds it, as
    for the other kernels)."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor) -> None:
        if q.shape[1] % BLOCK:
            raise ValueError(f"q8 takes inputs in blocks of {BLOCK}, not {q.shape[1]}")
        self.out_features, self.in_features = q.shape
        self.handle, (self.q, self.scales) = OP.hold(self, [q, scales.float()])

    def dequantize(self) -> torch.Tensor:
        """float32 [out, in]: the weights this kernel multiplies by."""
        return self.q.float() * self.scales[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in x's dtype (float32 or bfloat16)."""
        return OP(x, self.handle, self.out_features, (self.q, self.scales))
