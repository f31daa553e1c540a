"""The weight kernels side by side: one decoder layer's projections and the lm_head, by rows.

    .venv/bin/python -m bench.linear_kernels            # figures in docs/engine.md

SmolLM2-135M's shapes (hidden 576, MLP 1536, 9 query and 3 KV heads of 64, vocabulary
49,152), fused as the runner fuses them (QKV one 960×576 matmul, gate/up one 3072×576), random
weights (a kernel's time does not depend on the values). Each kernel gets the rows it takes in
the engine: float32 (dense GEMM, fbgemm's fp16, q8, q4_1), bfloat16 (dense GEMM, torch's int8
and int4 weight-only kernels, q8, q4_1). Prints µs per layer and per lm_head at each row count, the
fastest kernel of each, and every kernel's time over the fastest. The runner measures its own
limit at start (`inference/engine/weights/crossover.py`); `auto` follows that, not this.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bench import cpu_info
from bench.stats import median_seconds
from inference.engine.weights.choice import fp16_missing, int4_kernel_missing
from inference.engine.weights.projection import Projection, Q4Matrix
from inference.engine.weights.q4_1 import q4_1_kernel_missing
from inference.engine.weights.q8 import q8_kernel_missing

HIDDEN, MLP, Q_OUT, KV_OUT, VOCAB = 576, 1536, 576, 192, 49152
LAYER = [(Q_OUT + 2 * KV_OUT, HIDDEN), (HIDDEN, HIDDEN), (2 * MLP, HIDDEN), (HIDDEN, MLP)]
HEAD = [(VOCAB, HIDDEN)]
F32, BF16 = torch.float32, torch.bfloat16
# kernel name -> (the rows' dtype, how a projection of a random [out, in] weight is built,
# which of its packings runs)
Build = Callable[[torch.Tensor], Projection]
KERNELS: dict[str, tuple[torch.dtype, Build, str]] = {
    "float32": (F32, lambda w: Projection(w, None), "dense"),
    "fp16": (F32, lambda w: Projection.from_fp16(w, None), "small"),
    "q8 f32": (F32, lambda w: Projection.from_dense_q8(w, None, 0, False), "small"),
    "q4_1 f32": (F32, lambda w: q4_1(w), "small"),
    "bf16": (BF16, lambda w: Projection(w.to(BF16), None), "dense"),
    "int8": (BF16, lambda w: Projection.from_dense_int8(w.to(BF16), None, 0), "small"),
    "q8 bf16": (BF16, lambda w: Projection.from_dense_q8(w.to(BF16), None, 0, False), "small"),
    "q4_1 bf16": (BF16, lambda w: q4_1(w.to(BF16)), "small"),
    "int4": (BF16, lambda w: int4(w), "small"),
}


def random_q4(weight: torch.Tensor) -> Q4Matrix:
    """A random Q4_1 matrix of the weight's shape."""
    n, k = weight.shape
    scales = torch.rand(n, k // 32) * 0.02
    return Q4Matrix(torch.randint(0, 16, (n, k), dtype=torch.uint8), scales, -8 * scales)


def int4(weight: torch.Tensor) -> Projection:
    """A random Q4_1 matrix packed for torch's int4 kernel."""
    return Projection.from_q4(random_q4(weight), None, BF16, max_rows=0)


def q4_1(weight: torch.Tensor) -> Projection:
    """A random Q4_1 matrix for the q4_1 kernel (its dense packing `weight`, unused here)."""
    return Projection.from_q4_1(random_q4(weight), weight, None, large=False)


def available() -> list[str]:
    """The kernels that run here; the others are named with the reason."""
    tiny = torch.nn.Linear(32, 8)
    missing = {
        "fp16": fp16_missing(tiny),
        "q8 f32": q8_kernel_missing(),
        "q8 bf16": q8_kernel_missing(),
        "q4_1 f32": q4_1_kernel_missing(),
        "q4_1 bf16": q4_1_kernel_missing(),
        "int4": int4_kernel_missing(),
    }
    for name, why in missing.items():
        if why:
            print(f"{name}: not measured ({why})")
    return [name for name in KERNELS if not missing.get(name)]


def kernel_us(name: str, shapes: list[tuple[int, int]], rows: list[int], repeats: int):
    """µs per call of the projections of `shapes` on one kernel, at each row count."""
    dtype, build, packing = KERNELS[name]
    projections = [build(torch.randn(n, k) * 0.02) for n, k in shapes]
    calls = [p.small_mm if packing == "small" else p.dense_mm for p in projections]
    figures = {}
    for count in rows:
        xs = [torch.randn(count, p.in_features, dtype=dtype) for p in projections]

        def run(xs: list[torch.Tensor] = xs) -> None:
            for call, x in zip(calls, xs, strict=True):
                call(x)

        with torch.inference_mode():
            figures[count] = median_seconds(run, repeats, warmup=10) * 1e6
    return figures


def table(title: str, shapes: list[tuple[int, int]], names: list[str], args) -> None:
    """Every kernel's µs at each row count, the fastest, and each over the fastest."""
    figures = {name: kernel_us(name, shapes, args.rows, args.repeats) for name in names}
    print(f"\n{title}: µs per call (× the fastest)")
    print(f"{'rows':>5} " + " ".join(f"{name:>16}" for name in names) + "  fastest")
    for count in args.rows:
        best = min(figures[name][count] for name in names)
        cells = [f"{figures[n][count]:>8.0f} ({figures[n][count] / best:4.2f}×)" for n in names]
        fastest = min(names, key=lambda n: figures[n][count])
        print(f"{count:>5} " + " ".join(f"{c:>16}" for c in cells) + f"  {fastest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    cpu = cpu_info.cpu_facts()
    print(f"{cpu_info.line(cpu)}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    names = available()
    table("a decoder layer's 4 projections", LAYER, names, args)
    table("the lm_head", HEAD, names, args)


if __name__ == "__main__":
    main()
