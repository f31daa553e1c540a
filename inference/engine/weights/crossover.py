"""Up to how many rows a weight-only kernel beats the dense GEMM on this CPU, measured at start.

The crossover moves with the CPU (native bf16 or not, AMX, cache sizes) and the model's dtype:
on a Xeon with AVX-512 BF16 int8 won up to 8 rows of a bfloat16 model; on one without native
bf16, under a float32 model, the int8 kernel (on bfloat16 rows) wins at one row and the float32
GEMM well before 32. So the runner times one layer's own projections, both packings, at each
row count of ROWS and takes the largest count the weight-only kernel still wins, stopping at
its first loss (a ratio of WIN or more). It takes well under a second.
"""

from __future__ import annotations

import time

import torch

from inference.engine.weights.layers import LayerProjections

ROWS = (1, 2, 4, 8, 16, 32)
REPEATS = 7
# A win is a clear one: timings at start swing by ±10% on a shared machine, and at a tie the
# dense packing is the safer pick (it does not dequantize per call).
WIN = 0.9


def _median_seconds(run, x: torch.Tensor) -> float:
    """Median of REPEATS timed calls after one untimed one (first-call set-up)."""
    run(x)
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def layer_seconds(layer: LayerProjections, rows: int, small: bool) -> float:
    """One layer's four projections at `rows` rows, on one kernel (median seconds)."""
    total = 0.0
    with torch.inference_mode():
        for projection in (layer.qkv, layer.o, layer.gate_up, layer.down):
            x = torch.randn(rows, projection.in_features, dtype=projection.dense.dtype)
            run = projection.small_mm if small else projection.dense_mm
            total += _median_seconds(run, x)
    return total


def small_max_rows(layer: LayerProjections) -> tuple[int, dict[int, float]]:
    """The largest row count of ROWS at which the weight-only kernel wins (0: never), and
    the measured ratio small / dense at each row count timed."""
    best = 0
    ratios: dict[int, float] = {}
    for rows in ROWS:
        ratio = layer_seconds(layer, rows, small=True) / layer_seconds(layer, rows, small=False)
        ratios[rows] = round(ratio, 2)
        if ratio >= WIN:
            break
        best = rows
    return best, ratios


def set_max_rows(layers: list[LayerProjections], rows: int) -> None:
    """Every projection picks its weight-only kernel up to `rows` rows."""
    for layer in layers:
        for projection in (layer.qkv, layer.o, layer.gate_up, layer.down):
            if projection.small is not None:
                projection.max_rows = rows
