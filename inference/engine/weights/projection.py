"""A decoder projection with two packings, and the kernel picked per call by the row count.

torch's weight-only CPU kernels (int4 group-32, int8 per row) read a quarter (a half) of
bf16's bytes, so they win when a step has few rows (decode of a few streams: the matmul is
memory bound), but they dequantize per row tile and lose to the dense bf16 GEMM when many
rows share each weight read. A q4 or int8 projection therefore keeps both packings of the
same weights (the dense one is the quantized values in the compute dtype) and picks the
kernel by the rows of each call. An fp16 projection (fbgemm's half-precision GEMM, `fp16.py`)
uses its one kernel at every row count. A q8 (`q8.py`) or q4_1 (`q4_1.py`) one under a float32
model takes fbgemm's fp16 GEMM above its crossover (`large`): the float32 GEMM would read twice
the bytes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inference.engine.weights.fp16 import Fp16Matrix
from inference.engine.weights.q4_1 import Q41Matrix
from inference.engine.weights.q8 import Q8Matrix, int8_rows

GROUP = 32
ZERO_POINT = 8
# The packing of a weight-only kernel: ("int4", (packed, scales_and_zeros)), ("int8", (int8
# weights, per-row scales)), ("fp16", fbgemm's packed matrix), ("q8", int8 rows by handle) or
# ("q4_1", Q4_1 blocks by handle).
Kernel = Fp16Matrix | Q8Matrix | Q41Matrix
Packing = tuple[str, tuple[torch.Tensor, torch.Tensor] | Kernel]


@dataclass(frozen=True)
class Q4Matrix:
    """A [N, K] weight as GGUF Q4_1 holds it: w = scale·q + min per group of 32 along K."""

    q: torch.Tensor  # uint8 [N, K], values 0..15
    scales: torch.Tensor  # float32 [N, K / 32]
    mins: torch.Tensor  # float32 [N, K / 32]

    @staticmethod
    def cat(parts: list[Q4Matrix]) -> Q4Matrix:
        """Stack along the output rows (fused projections)."""
        return Q4Matrix(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scales for p in parts]),
            torch.cat([p.mins for p in parts]),
        )

    def take_rows(self, index: torch.Tensor) -> Q4Matrix:
        """The rows in `index` order (GGUF's rope permutation of Q/K, undone)."""
        return Q4Matrix(self.q[index], self.scales[index], self.mins[index])

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K]: scale·q + min, exactly what the GGUF stores."""
        n, k = self.q.shape
        groups = self.q.view(n, k // GROUP, GROUP).float()
        w = groups * self.scales[..., None] + self.mins[..., None]
        return w.view(n, k)


class Projection:
    """y = x Wᵀ (+ b): a weight-only kernel (int4, int8, q8, q4_1) up to `max_rows`, dense above.

    `small` is the packing the weight-only kernel reads (`Packing`); None for a dense-only
    projection. `large`, when given, is the kernel above `max_rows` in place of the dense GEMM.
    """

    def __init__(
        self,
        dense: torch.Tensor,
        bias: torch.Tensor | None = None,
        small: Packing | None = None,
        max_rows: int = 0,
        large: Fp16Matrix | None = None,
    ) -> None:
        self.dense = dense
        self.bias = bias
        self.small = small
        self.large = large
        self.max_rows = max_rows if small is not None else 0
        self.out_features, self.in_features = dense.shape

    @classmethod
    def from_q4(
        cls,
        matrix: Q4Matrix,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        max_rows: int,
    ) -> Projection:
        """Pack Q4_1 blocks for torch's kernel, which computes (q − 8)·scale + zero per group.

        So scale = d and zero = m + 8d, held in the kernel's activation dtype
        (`kernel_dtype`: bfloat16, also under a float32 model), so rounded to 8 bits of
        mantissa. The dense packing (in the compute dtype) is built from the same rounded
        scale and zero, so both kernels multiply by the same weights.
        """
        scales = matrix.scales.to(kernel_dtype(dtype))
        zeros = (matrix.mins + ZERO_POINT * matrix.scales).to(kernel_dtype(dtype))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(matrix.q.to(torch.int32), 1)
        scales_and_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
        rounded = Q4Matrix(matrix.q, scales.float(), zeros.float() - ZERO_POINT * scales.float())
        dense = rounded.dequantize().to(dtype)
        return cls(dense, bias, ("int4", (packed, scales_and_zeros)), max_rows)

    @classmethod
    def from_dense_int8(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int
    ) -> Projection:
        """Symmetric int8 per output row, for torch's int8 weight-only kernel.

        Half of bf16's bytes with a rounding error of ~1% of a row's largest weight / 254
        per weight; the dense packing holds the same rounded values (scales as the kernel
        holds them, in `kernel_dtype`), so both kernels multiply by the same weights.
        """
        q, scales = int8_rows(weight)
        scales = scales.to(kernel_dtype(weight.dtype))
        dense = (q.float() * scales.float()[:, None]).to(weight.dtype)
        return cls(dense, bias, ("int8", (q, scales)), max_rows)

    @classmethod
    def from_dense_q8(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int, large: bool
    ) -> Projection:
        """int8 rows for the q8 kernel (`q8.py`), rounded as `from_dense_int8` rounds them.

        With `large` (a float32 model) fbgemm's fp16 GEMM of the same rounded weights runs
        above `max_rows`, and `dense` stays the model's own weight (no float32 copy; it is
        only read for its shape and by `dense_mm`'s tests). Otherwise the dense packing holds
        the rounded weights in the model's dtype.
        """
        matrix = Q8Matrix(*int8_rows(weight))
        if large:
            fp16 = Fp16Matrix(matrix.dequantize())
            return cls(weight, bias, ("q8", matrix), max_rows, large=fp16)
        return cls(matrix.dequantize().to(weight.dtype), bias, ("q8", matrix), max_rows)

    @classmethod
    def from_q4_1(
        cls, matrix: Q4Matrix, dense: torch.Tensor, bias: torch.Tensor | None, large: bool
    ) -> Projection:
        """The GGUF's Q4_1 blocks for the q4_1 kernel (`q4_1.py`); `dense` is the model's own
        fused weight (the same values, dequantized by the loader), no copy of it.

        With `large` (a float32 model) fbgemm's fp16 GEMM of `dense` runs above `max_rows`;
        otherwise `dense` itself (bfloat16: the GGUF's values rounded to 8 bits of mantissa).
        """
        kernel = Q41Matrix(matrix.q, matrix.scales, matrix.mins)
        fp16 = Fp16Matrix(dense) if large else None
        return cls(dense, bias, ("q4_1", kernel), 0, large=fp16)

    @classmethod
    def from_fp16(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Projection:
        """fbgemm's fp16 GEMM at every row count (`max_rows` unbounded). The dense packing is
        the float32 weight itself, kept for its shape and for `dense_mm` (tests): it is not
        rounded to float16, so only the fp16 kernel multiplies by the rounded weights."""
        return cls(weight, bias, ("fp16", Fp16Matrix(weight)), sys.maxsize)

    def dense_mm(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel above `max_rows` (`large`, or the oneDNN/MKL GEMM), whatever the rows."""
        if self.large is not None:
            return small_kernel(x, "fp16", self.large, self.bias)
        return F.linear(x, self.dense, self.bias)

    def small_mm(self, x: torch.Tensor) -> torch.Tensor:
        """The weight-only kernel, whatever the row count (needs its packing)."""
        if self.small is None:
            raise ValueError("this projection has no weight-only packing")
        return small_kernel(x, *self.small, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> [rows, out], on the kernel that is faster at this many rows."""
        if x.shape[0] <= self.max_rows:
            return self.small_mm(x)
        return self.dense_mm(x)


def kernel_dtype(compute: torch.dtype) -> torch.dtype:
    """The activations' dtype for the weight-only kernels under a model in `compute`.

    torch's int4/int8 CPU kernels are fast only on bfloat16 (or half) activations: on
    float32 ones they take a slow path (10–30× the bf16 time, measured on an AVX-512 Xeon
    without native bf16). So a float32 model hands them its rows in bfloat16 and takes the
    result back in float32; the rest of the model stays float32.
    """
    return torch.bfloat16 if compute == torch.float32 else compute


def small_kernel(
    x: torch.Tensor,
    kind: str,
    packing: tuple[torch.Tensor, torch.Tensor] | Kernel,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """torch's int4 (group 32) or int8 (per row) weight-only matmul, fbgemm's fp16 GEMM or
    the q8 or q4_1 kernel, plus the bias.

    The int4/int8 rows go in the packing's dtype (its scales'), the result comes back in
    theirs; fp16 takes and gives float32, q8 and q4_1 float32 or bfloat16.
    """
    if kind in ("fp16", "q8", "q4_1"):
        y = packing(x)
        return y if bias is None else y + bias
    weight, scales = packing
    rows = x.to(scales.dtype)
    if kind == "int4":
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, weight, GROUP, scales)
    else:
        y = torch._weight_int8pack_mm(rows, weight, scales)
    y = y.to(x.dtype)
    return y if bias is None else y + bias
