"""fbgemm's half-precision GEMM: float16 weights, float32 arithmetic, for a float32 model.

On a CPU without native bfloat16 (AVX2 only: the engine's model is float32 there) torch's
weight-only kernels take bfloat16 rows, which such a CPU emulates, and the float32 GEMM reads
four bytes a weight. fbgemm's fp16 GEMM (`quantized::linear_dynamic_fp16`, in every x86 build
of torch) reads two and multiplies in float32, with no rounding of the activations: on a
2-core AVX2 EPYC (2026-12-02) one SmolLM2 layer's four projections took 231 µs at one row
(int8 weight-only 208, float32 344) and 1.59 ms at 32 rows (int8 2.60, float32 2.44), the
lm_head 2.3 ms at one row (float32 8.9) and 16.4 ms at 32 rows (float32 34.0). So it runs
every row count of a step, prompt chunks included.

fbgemm's packed matrix is a TorchScript object that inductor cannot hold as a graph constant,
so the compiled step reaches it through an opaque op, `tandem::fp16_linear`, that names the
matrix by a handle into this module's registry (`handles.py`).
"""

from __future__ import annotations

import torch

from inference.engine.weights.handles import Registry

# handle -> fbgemm's packed matrix
_packed: Registry[object] = Registry()


def fp16_kernel_missing() -> str | None:
    """None when fbgemm's fp16 GEMM runs here, else why it does not."""
    try:
        packed = torch.ops.quantized.linear_prepack_fp16(torch.ones(8, 64), None)
        torch.ops.quantized.linear_dynamic_fp16(torch.ones(1, 64), packed)
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        return f"torch {torch.__version__} has no fbgemm fp16 GEMM here ({exc})"
    return None


# Defined and implemented apart (not `torch.library.custom_op`, whose wrapper cost ~11 µs a
# call against ~3 µs here: 121 calls a step).
torch.library.define("tandem::fp16_linear", "(Tensor x, int handle, int out_features) -> Tensor")


@torch.library.impl("tandem::fp16_linear", "cpu")
def _fp16_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    """x [rows, in] float32 times the registered fp16 matrix `handle`: [rows, out]."""
    return torch.ops.quantized.linear_dynamic_fp16(x, _packed[handle])


@torch.library.register_fake("tandem::fp16_linear")
def _fp16_linear_shape(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


class Fp16Matrix:
    """One [out, in] weight rounded to float16 and packed for fbgemm (no bias: the caller adds
    it, as for the other kernels)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.out_features, self.in_features = weight.shape
        weight = weight.float().contiguous()
        self.handle, self.packed = _packed.hold(
            self, [weight], lambda _: torch.ops.quantized.linear_prepack_fp16(weight, None)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> [rows, out], float32 in and out. Eager calls skip the opaque op:
        its Python dispatch cost ~45 µs a call, 5 ms a step at 121 calls."""
        if torch.compiler.is_compiling():
            return torch.ops.tandem.fp16_linear(x, self.handle, self.out_features)
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
