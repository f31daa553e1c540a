"""The GGUF's Q4_1 weights as they are, times int8 activations: TANDEM_WEIGHTS=q4_1, the C++
kernel in `q4_1_linear.cpp`.

At one row a step reads every weight once, so bytes per weight set its floor: q8 reads one,
fbgemm's fp16 two, Q4_1 0.75 (16 bytes of nibbles and a scale and a minimum per 32 weights,
here widened to float32: 24 bytes a block). The packaged model is that GGUF, so these are the
model's own weights, not a second rounding of them (q8 rounds the dequantized Q4_1 values to
int8 per row; torch's int4 kernel, TANDEM_WEIGHTS=q4, rounds d and m to bfloat16). The
activations are rounded to int8 per block of 32, as q8 rounds them, with each block's sum
kept for the minimum's term. Built for AVX2, AVX-512BW and AVX-512 VNNI; plain C++ elsewhere.
Its matrices are called by handle (`native_op.py`).
"""

from __future__ import annotations

import torch

from inference.engine.native_build import native_module
from inference.engine.weights.native_op import NativeOp

BLOCK = 32
BLOCK_BYTES = 24  # float32 d, float32 m, 16 bytes of nibbles
# handle -> (uint8 blocks [out, in / 32 · 24],), also held by the C++ op
OP = NativeOp("q4_1")


def pack(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """q (0..15) [N, K], d and m [N, K / 32] as the kernel's blocks, uint8 [N, K / 32 · 24]:
    d, m, then byte i holding q[i] low and q[16 + i] high, as the GGUF orders them."""
    rows, width = q.shape
    groups = q.to(torch.uint8).view(rows, width // BLOCK, BLOCK)
    nibbles = groups[..., : BLOCK // 2] | (groups[..., BLOCK // 2 :] << 4)
    floats = torch.stack([scales.float(), mins.float()], dim=-1).contiguous()
    blocks = torch.cat([floats.view(torch.uint8), nibbles], dim=-1)
    return blocks.reshape(rows, -1).contiguous()


def unpack(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`pack`'s inverse: q uint8 [N, K], d and m float32 [N, K / 32]."""
    rows = blocks.shape[0]
    grouped = blocks.view(rows, -1, BLOCK_BYTES)
    floats = grouped[..., :8].contiguous().view(torch.float32)
    nibbles = grouped[..., 8:]
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).reshape(rows, -1)
    return q, floats[..., 0].contiguous(), floats[..., 1].contiguous()


def q4_1_kernel_missing() -> str | None:
    """None when the kernel is built and runs here, else why it does not."""
    try:
        blocks = pack(torch.ones(2, BLOCK, dtype=torch.uint8), torch.ones(2, 1), torch.zeros(2, 1))
        native_module().q4_1_linear(torch.ones(1, BLOCK), blocks)
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        return f"the q4_1 kernel did not build or run here ({exc})"
    return None


class Q41Matrix:
    """One [out, in] weight as Q4_1 blocks (no bias: the caller adds it)."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> None:
        if q.shape[1] % BLOCK:
            raise ValueError(f"q4_1 takes inputs in blocks of {BLOCK}, not {q.shape[1]}")
        self.out_features, self.in_features = q.shape
        self.handle, (self.blocks,) = OP.hold(self, [pack(q, scales, mins)])

    def dequantize(self) -> torch.Tensor:
        """float32 [out, in]: d·q + m, the weights this kernel multiplies by."""
        q, scales, mins = unpack(self.blocks)
        groups = q.view(self.out_features, -1, BLOCK).float()
        return (groups * scales[..., None] + mins[..., None]).view(self.out_features, -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in x's dtype (float32 or bfloat16)."""
        return OP(x, self.handle, self.out_features, (self.blocks,))
