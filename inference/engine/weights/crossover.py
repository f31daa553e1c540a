"""Up to how many rows a weight-only kernel beats the dense GEMM on this CPU, measured at start.

The crossover moves with the CPU (native bf16 or not, AMX, cache sizes) and the model's dtype:
on a Xeon with AVX-512 BF16 int8 won up to 8 rows of a bfloat16 model; on one without native
bf16, under a float32 model, the int8 kernel (on bfloat16 rows) wins at one row and the float32
GEMM well before 32. So the runner times the projections, both packings, at each row count of
ROWS and takes the largest count the weight-only kernel still wins, stopping at its first loss
(a ratio of WIN or more); then the lm_head on its own, up to that count: its shape (576 →
49,152 for SmolLM2) crosses earlier.

They are timed as a step reads them: every layer's projections in turn, then the lm_head after
a pass over the layers, so the weights come from memory, not from a cache that holds one layer
timed again and again. One layer timed alone under-rated the kernel that reads fewer bytes: on
a 2-core AMD EPYC Zen 3 (AVX2) q8 took 0.57× fp16's time at one row and 0.93× at 4 for one
layer (crossover 2 rows), 0.53× and 0.72× at 8 over the whole stack (crossover 8 rows); 8
streams ran 184 → 233 tok/s. It takes about 2 s on that machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inference.engine.timing import fastest_seconds
from inference.engine.weights.layers import LayerProjections
from inference.engine.weights.projection import Projection

ROWS = (1, 2, 4, 8, 16, 32)
REPEATS = 7
# A win is a clear one: timings at start swing by ±10% on a shared machine, and at a tie the
# dense packing is the safer pick (it does not dequantize per call).
WIN = 0.9


def pass_seconds(
    projections: Sequence[Projection], rows: int, small: bool, before: Sequence[Projection]
) -> float:
    """One pass over `projections` at `rows` rows, in order, on one kernel: the fastest of
    REPEATS passes, each after an untimed pass over `before` (what the step reads first)."""
    inputs: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def calls(chosen: Sequence[Projection]) -> list[tuple[object, torch.Tensor]]:
        made = []
        for projection in chosen:
            key = (projection.in_features, projection.dense.dtype)
            if key not in inputs:
                inputs[key] = torch.randn(rows, projection.in_features, dtype=key[1])
            made.append((projection.small_mm if small else projection.dense_mm, inputs[key]))
        return made

    timed, ahead = calls(projections), calls(before)

    def run(chosen: list[tuple[object, torch.Tensor]]) -> None:
        for multiply, x in chosen:
            multiply(x)

    with torch.inference_mode():
        run(timed)  # first-call set-up, untimed
        return fastest_seconds(lambda: run(timed), REPEATS, before=lambda: run(ahead))


def small_max_rows(
    projections: list[Projection],
    rows: tuple[int, ...] = ROWS,
    before: Sequence[Projection] = (),
) -> tuple[int, dict[int, float]]:
    """The largest row count of `rows` at which the weight-only kernel wins (0: never) over
    a pass of `projections` read after `before`, and the measured ratio small / dense at each
    row count timed."""
    best = 0
    ratios: dict[int, float] = {}
    for count in rows:
        small = pass_seconds(projections, count, True, before)
        ratio = small / pass_seconds(projections, count, False, before)
        ratios[count] = round(ratio, 2)
        if ratio >= WIN:
            break
        best = count
    return best, ratios


def layer_projections(layer: LayerProjections) -> list[Projection]:
    """A layer's four projections, in the order the step runs them."""
    return [layer.qkv, layer.o, layer.gate_up, layer.down]


def stack_projections(layers: list[LayerProjections]) -> list[Projection]:
    """Every layer's projections, in the order the step runs them."""
    return [p for layer in layers for p in layer_projections(layer)]


def set_max_rows(layers: list[LayerProjections], rows: int) -> None:
    """Every projection picks its weight-only kernel up to `rows` rows."""
    for layer in layers:
        for projection in layer_projections(layer):
            if projection.small is not None:
                projection.max_rows = rows
