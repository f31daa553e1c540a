"""The cost of one decoder layer's linears by kernel and row count: bf16 against int4 g32.

    .venv/bin/python -m bench.linear_kernels            # figures in docs/engine.md

SmolLM2-135M's shapes (hidden 576, MLP 1536, 9 query and 3 KV heads of 64), random weights
(a kernel's time does not depend on the values). For each row count it times one layer's
projections fused (QKV as one 960×576 matmul, gate/up as one 3072×576) and unfused, on
`F.linear` in bfloat16 and on torch's int4 weight-only kernel, and prints the largest row
count at which int4 is faster per layer (the runner measures its own limit at start:
`inference/engine/weights/crossover.py`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bench.stats import median_seconds
from inference.engine.weights.projection import Projection, Q4Matrix

HIDDEN, MLP, Q_OUT, KV_OUT = 576, 1536, 576, 192
FUSED = [(Q_OUT + 2 * KV_OUT, HIDDEN), (HIDDEN, HIDDEN), (2 * MLP, HIDDEN), (HIDDEN, MLP)]
UNFUSED = [
    (Q_OUT, HIDDEN),
    (KV_OUT, HIDDEN),
    (KV_OUT, HIDDEN),
    (HIDDEN, HIDDEN),
    (MLP, HIDDEN),
    (MLP, HIDDEN),
    (HIDDEN, MLP),
]


def median_us(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of fn() in microseconds, after ten warm-up calls (kernel set-up)."""
    return median_seconds(fn, repeats, warmup=10) * 1e6


def layer(shapes: list[tuple[int, int]]) -> list[Projection]:
    """Random projections of the given [out, in] shapes holding both packings."""
    out = []
    for n, k in shapes:
        q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
        scales = torch.rand(n, k // 32) * 0.02
        matrix = Q4Matrix(q, scales, -8 * scales)
        out.append(Projection.from_q4(matrix, None, torch.bfloat16, max_rows=0))
    return out


def layer_us(projections: list[Projection], rows: int, kernel: str, repeats: int) -> float:
    """One layer's projections at `rows` rows on one kernel, microseconds."""
    xs = [torch.randn(rows, p.in_features, dtype=torch.bfloat16) for p in projections]
    calls = [p.small_mm if kernel == "int4" else p.dense_mm for p in projections]

    def run() -> None:
        for call, x in zip(calls, xs, strict=True):
            call(x)

    with torch.inference_mode():
        return median_us(run, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 6, 8, 10, 12, 16, 32])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    fused, unfused = layer(FUSED), layer(UNFUSED)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; µs per layer")
    print(f"{'rows':>5} {'bf16':>8} {'bf16 fused':>11} {'int4':>8} {'int4 fused':>11}")
    crossover, faster = 0, True
    for rows in args.rows:
        figures = [
            layer_us(unfused, rows, "bf16", args.repeats),
            layer_us(fused, rows, "bf16", args.repeats),
            layer_us(unfused, rows, "int4", args.repeats),
            layer_us(fused, rows, "int4", args.repeats),
        ]
        bf16, bf16_fused, int4, int4_fused = figures
        print(f"{rows:>5} {bf16:>8.0f} {bf16_fused:>11.0f} {int4:>8.0f} {int4_fused:>11.0f}")
        faster = faster and int4_fused < bf16_fused
        if faster:
            crossover = rows
    print(f"int4 (fused) is faster up to {crossover} rows per step")


if __name__ == "__main__":
    main()
