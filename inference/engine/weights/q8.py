"""int8 weights times int8 activations: TANDEM_WEIGHTS=q8, the C++ kernel in `q8_linear.cpp`.

At one row a step is a read of every weight, so bytes per weight set its floor. A float32 model
(the engine's dtype where the CPU has no native bfloat16: AVX2 machines) had fbgemm's fp16 GEMM,
two bytes a weight; torch's int8 weight-only kernel takes bfloat16 rows, which such a CPU
emulates. This kernel reads one byte a weight (symmetric int8 per output row, as TANDEM_WEIGHTS=
int8 rounds them) and rounds each row of activations to int8 per block of 32 with a scale of its
own, llama.cpp's Q8_0 scheme: a block's products are summed in int32 by the CPU's int8 dot
product, so no weight is ever widened to float. Built for the instructions the CPU has (AVX2,
AVX-512BW, AVX-512 VNNI; plain C++ without AVX2, where it is slow and `auto` does not take it).
Its matrices are called by handle (`native_op.py`). It reads them in tiles of a few output
rows whose blocks are interleaved (`tile_rows`), one ascending stream per task: at one row a
step's weights are read from memory, not cache, and on a 2-core AMD EPYC Zen 2 a step's q8
matmuls took 6.8 ms so against 8.5 with the rows one after another. They sit on huge pages
(`huge_pages.py`).
"""

from __future__ import annotations

import torch

from inference.engine.native_build import native_module
from inference.engine.weights import huge_pages
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


def tile_rows(q: torch.Tensor) -> torch.Tensor:
    """int8 [out, in] in the kernel's layout: each full tile of `q8_tile` rows holds their
    first blocks of 32, then their second blocks, and so on; the rows after the last full tile
    stay as they are."""
    tile = native_module().q8_tile
    out, width = q.shape
    full = out // tile * tile
    tiles = q[:full].view(out // tile, tile, width // BLOCK, BLOCK).transpose(1, 2)
    return torch.cat([tiles.reshape(full, width), q[full:]]).contiguous()


def untile_rows(tiled: torch.Tensor) -> torch.Tensor:
    """The inverse of `tile_rows`: int8 [out, in] row after row."""
    tile = native_module().q8_tile
    out, width = tiled.shape
    full = out // tile * tile
    tiles = tiled[:full].view(out // tile, width // BLOCK, tile, BLOCK).transpose(1, 2)
    return torch.cat([tiles.reshape(full, width), tiled[full:]])


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
    for the other kernels), held in the kernel's tiled layout."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor) -> None:
        if q.shape[1] % BLOCK:
            raise ValueError(f"q8 takes inputs in blocks of {BLOCK}, not {q.shape[1]}")
        self.out_features, self.in_features = q.shape
        tiled = huge_pages.place(tile_rows(q))
        self.handle, (self.tiled, self.scales) = OP.hold(self, [tiled, scales.float()])

    def dequantize(self) -> torch.Tensor:
        """float32 [out, in]: the weights this kernel multiplies by."""
        return untile_rows(self.tiled).float() * self.scales[:, None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in x's dtype (float32 or bfloat16)."""
        return OP(x, self.handle, self.out_features, (self.tiled, self.scales))
