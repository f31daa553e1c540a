"""Up to how many rows a weight-only kernel beats the dense GEMM on this CPU, measured at start.

The crossover moves with the CPU (native bf16 or not, AMX, cache sizes) and the model's dtype:
on a Xeon with AVX-512 BF16 int8 won up to 8 rows of a bfloat16 model; on one without native
bf16, under a float32 model, the int8 kernel (on bfloat16 rows) wins at one row and the float32
GEMM well before 32. So the runner times one layer's own projections, both packings, at each
row count of ROWS and takes the largest count the weight-only kernel still wins, stopping at
its first loss (a ratio of WIN or more); then the lm_head on its own, up to that count: its
shape (576 → 49,152 for SmolLM2) crosses earlier (int8 against dense bf16 on a 2-core AMD
EPYC Zen 4, 2026-12-03: 3.0 / 5.1 ms at one row, 4.0 / 5.5 at 4, 6.1 / 4.7 at 8, where the
layers' int8 still won). It takes about a second.
"""

from __future__ import annotations

import torch

from inference.engine.timing import fastest_seconds
from inference.engine.weights.layers import LayerProjections
from inference.engine.weights.projection import Projection

ROWS = (1, 2, 4, 8, 16, 32)
REPEATS = 7
# A win is a clear one: timings at start swing by ±10% on a shared machine, and at a tie the
# dense packing is the safer pick (it does not dequantize per call).
WIN = 0.9


def _fastest_seconds(run, x: torch.Tensor) -> float:
    """The fastest of REPEATS timed calls after one untimed one (first-call set-up)."""
    run(x)
    return fastest_seconds(lambda: run(x), REPEATS)


def kernel_seconds(projections: list[Projection], rows: int, small: bool) -> float:
    """The projections at `rows` rows, on one kernel (sum of their fastest seconds)."""
    total = 0.0
    with torch.inference_mode():
        for projection in projections:
            x = torch.randn(rows, projection.in_features, dtype=projection.dense.dtype)
            run = projection.small_mm if small else projection.dense_mm
            total += _fastest_seconds(run, x)
    return total


def small_max_rows(
    projections: list[Projection], rows: tuple[int, ...] = ROWS
) -> tuple[int, dict[int, float]]:
    """The largest row count of `rows` at which the weight-only kernel wins (0: never), and
    the measured ratio small / dense at each row count timed."""
    best = 0
    ratios: dict[int, float] = {}
    for count in rows:
        small = kernel_seconds(projections, count, small=True)
        ratio = small / kernel_seconds(projections, count, small=False)
        ratios[count] = round(ratio, 2)
        if ratio >= WIN:
            break
        best = count
    return best, ratios


def layer_projections(layer: LayerProjections) -> list[Projection]:
    """A layer's four projections, in the order the step runs them."""
    return [layer.qkv, layer.o, layer.gate_up, layer.down]


def set_max_rows(layers: list[LayerProjections], rows: int) -> None:
    """Every projection picks its weight-only kernel up to `rows` rows."""
    for layer in layers:
        for projection in layer_projections(layer):
            if projection.small is not None:
                projection.max_rows = rows
