"""TANDEM_WEIGHTS: which weights the runner multiplies by, and the runner built on them.

`bf16` is the model's own dense weights (in TANDEM_DTYPE's dtype, bfloat16 on CPUs that have
it, float32 elsewhere). `q4` reads the packaged GGUF's Q4_1 tensors into torch's int4 format.
`int8` rounds the dense weights to int8 per output row for torch's int8 weight-only kernel
(any model). `q8` rounds them the same way for our own kernel, which rounds the activations
to int8 too (`q8.py`). `q4_1` multiplies by the packaged GGUF's Q4_1 blocks as they are on our
own kernel (`q4_1.py`; the lm_head on fp16 or int8, whose activations stay float). Each keeps
a second packing and uses its own kernel up to the row count where it stops winning, measured
at start (`crossover.py`): the dense weights, or for q8 and q4_1 under a float32 model fbgemm's fp16
GEMM. `fp16` rounds a float32 model's weights to float16 for fbgemm's half-precision GEMM
(`fp16.py`), which runs every row count. `auto` times the weight-only kernels the model can
have here (q8 for a float32 model, the CPU lacking native bfloat16; int8 and q8 for a bfloat16
one) and takes the one fastest at one row among those that beat the other packing there; else
fp16 for a float32 model and bf16 for the rest. q4 (it changes greedy answers more) and q4_1
(fastest at one row, slower than q8 from two) are opt-in: docs/engine.md, "Weight formats".
A format that cannot be had falls back to bf16 and says why in one log line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import PreTrainedModel

from inference.engine.compile_cache import CompileCache, platform_key
from inference.engine.model_runner import LlamaRunner, runner_for
from inference.engine.weights.crossover import (
    ROWS,
    layer_projections,
    set_max_rows,
    small_max_rows,
    stack_projections,
)
from inference.engine.weights.fp16 import fp16_kernel_missing
from inference.engine.weights.layers import LayerProjections, layer_linears, q4_projection
from inference.engine.weights.projection import GROUP, Projection, Q4Matrix, kernel_dtype
from inference.engine.weights.q4 import read_layers
from inference.engine.weights.q4_1 import q4_1_kernel_missing
from inference.engine.weights.q8 import BLOCK, q8_instructions, q8_kernel_missing

log = logging.getLogger(__name__)

CHOICES = ("auto", "bf16", "q4", "int8", "q8", "q4_1", "fp16")


def int4_kernel_missing() -> str | None:
    """None when torch's int4 weight-only CPU kernel runs here, else why it does not."""
    try:
        q = torch.zeros(16, GROUP, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        scales = torch.ones(1, 16, 2, dtype=torch.bfloat16)
        x = torch.ones(1, GROUP, dtype=torch.bfloat16)
        torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales)
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        return f"torch {torch.__version__} has no int4 CPU kernel here ({exc})"
    return None


def int8_missing(model: PreTrainedModel) -> str | None:
    """None when torch's int8 weight-only kernel runs for this model here, else why not."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu":
        return "the int8 kernel is the CPU one and the model is not on the CPU"
    dtype = kernel_dtype(parameter.dtype)
    if dtype != torch.bfloat16:
        return f"int8 runs with bfloat16 activations and the model is in {parameter.dtype}"
    try:
        x = torch.ones(1, 64, dtype=dtype)
        weight = torch.ones(8, 64, dtype=torch.int8)
        torch._weight_int8pack_mm(x, weight, torch.ones(8, dtype=dtype))
    except (AttributeError, RuntimeError, NotImplementedError) as exc:
        return f"torch {torch.__version__} has no int8 CPU kernel here ({exc})"
    return None


def fp16_missing(model: PreTrainedModel) -> str | None:
    """None when fbgemm's fp16 GEMM can run this model's linears here, else why not."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu":
        return "fbgemm's fp16 GEMM is a CPU kernel and the model is not on the CPU"
    if parameter.dtype != torch.float32:
        return f"fp16 multiplies float32 rows and the model is in {parameter.dtype}"
    return fp16_kernel_missing()


def fp16_runner(model: PreTrainedModel) -> LlamaRunner:
    """Every decoder projection and the lm_head on fbgemm's fp16 GEMM."""
    layers = [
        LayerProjections(
            **{
                name: Projection.from_fp16(p.dense, p.bias)
                for name, p in vars(LlamaRunner.dense_layer(layer)).items()
            }
        )
        for layer in model.model.layers
    ]
    head = model.lm_head
    bias = None if head.bias is None else head.bias.detach()
    return LlamaRunner(
        model, layers, weights="fp16", head=Projection.from_fp16(head.weight.detach(), bias)
    )


def int8_head(model: PreTrainedModel) -> Projection:
    """The lm_head rounded to int8 per vocabulary row: at one row of a float32 model it is the
    largest single matmul of the step (49,152 × 576 for SmolLM2, 113 MB read per token)."""
    head = model.lm_head
    bias = None if head.bias is None else head.bias.detach()
    return Projection.from_dense_int8(head.weight.detach(), bias, 0)


def int8_layers(model: PreTrainedModel, max_rows: int) -> list[LayerProjections]:
    """Every decoder layer's fused projections rounded to int8, with their dense packing."""
    layers = []
    for layer in model.model.layers:
        dense = LlamaRunner.dense_layer(layer)
        built = {
            name: Projection.from_dense_int8(p.dense, p.bias, max_rows)
            for name, p in vars(dense).items()
        }
        layers.append(LayerProjections(**built))
    return layers


def blocks_missing(model: PreTrainedModel, kernel: str) -> str | None:
    """None when our int8 kernels (q8, q4_1) can take this model's rows, else why not."""
    parameter = next(model.parameters())
    if parameter.device.type != "cpu":
        return f"the {kernel} kernel is a CPU one and the model is not on the CPU"
    if parameter.dtype not in (torch.float32, torch.bfloat16):
        return f"{kernel} takes float32 or bfloat16 rows and the model is in {parameter.dtype}"
    widths = {
        p.in_features
        for layer in model.model.layers
        for p in layer.modules()
        if isinstance(p, torch.nn.Linear)
    }
    if any(width % BLOCK for width in widths):
        return (
            f"{kernel} takes inputs in blocks of {BLOCK} and the model has widths {sorted(widths)}"
        )
    return None


def q8_missing(model: PreTrainedModel) -> str | None:
    """None when the q8 kernel can run this model's linears here, else why not."""
    return blocks_missing(model, "q8") or q8_kernel_missing()


def q4_1_missing(model: PreTrainedModel, gguf: Path | None) -> str | None:
    """None when the q4_1 kernel can run this model's linears from its GGUF, else why not."""
    if gguf is None:
        return "the model is not the packaged GGUF (a local HF directory has no Q4_1 weights)"
    return blocks_missing(model, "q4_1") or q8_kernel_missing() or q4_1_kernel_missing()


def q8_projections(model: PreTrainedModel) -> tuple[list[LayerProjections], Projection]:
    """Every decoder projection and the lm_head as q8, with fbgemm's fp16 GEMM above the
    crossover under a float32 model (where fbgemm runs), the dense weights otherwise."""
    large = fp16_missing(model) is None
    layers = [
        LayerProjections(
            **{
                name: Projection.from_dense_q8(p.dense, p.bias, 0, large)
                for name, p in vars(LlamaRunner.dense_layer(layer)).items()
            }
        )
        for layer in model.model.layers
    ]
    head = model.lm_head
    bias = None if head.bias is None else head.bias.detach()
    return layers, Projection.from_dense_q8(head.weight.detach(), bias, 0, large)


def q4_1_projections(
    model: PreTrainedModel, gguf: Path
) -> tuple[list[LayerProjections], Projection]:
    """Every decoder projection from the GGUF's Q4_1 blocks (a fused one with a part of
    another kind on q8), with fbgemm's fp16 GEMM above the crossover under a float32 model,
    the dense weights otherwise; the lm_head on a kernel that keeps its activations in
    floating point (`float_head`).

    Raises ValueError when the GGUF does not fit the model.
    """
    large = fp16_missing(model) is None
    layers = []
    for layer, parts in zip(model.model.layers, read_layers(gguf, model), strict=True):
        dense = vars(LlamaRunner.dense_layer(layer))
        built = {}
        for name, p in dense.items():
            if all(isinstance(part, Q4Matrix) for part in parts[name]):
                matrix = Q4Matrix.cat(parts[name])
                built[name] = Projection.from_q4_1(matrix, p.dense, p.bias, large)
            else:
                built[name] = Projection.from_dense_q8(p.dense, p.bias, 0, large)
        layers.append(LayerProjections(**built))
    return layers, float_head(model)


def float_head(model: PreTrainedModel) -> Projection:
    """The lm_head on fbgemm's fp16 GEMM (float32 model) or torch's int8 kernel on bfloat16
    rows, q8 where neither runs: its activations are not rounded to int8.

    The first reply token to the canonical question is a near-tie (0.08 logits apart in
    float32); under q4_1's exact layers the head's int8 activations alone tip it (to
    "L'Étoile"), where fp16 of the same weights does not. +1 byte a head weight on a float32
    model (28 MB a step for SmolLM2)."""
    head = model.lm_head
    bias = None if head.bias is None else head.bias.detach()
    if fp16_missing(model) is None:
        return Projection.from_fp16(head.weight.detach(), bias)
    if int8_missing(model) is None:
        return int8_head(model)
    return Projection.from_dense_q8(head.weight.detach(), bias, 0, large=False)


def q4_missing(model: PreTrainedModel, gguf: Path | None) -> str | None:
    """None when the q4 weights can be used for this model, else why not."""
    if gguf is None:
        return "the model is not the packaged GGUF (a local HF directory has no Q4_1 weights)"
    if next(model.parameters()).device.type != "cpu":
        return "the int4 kernel is the CPU one and the model is not on the CPU"
    return int4_kernel_missing()


def q4_layers(model: PreTrainedModel, gguf: Path, max_rows: int) -> list[LayerProjections]:
    """Every decoder layer's projections from the GGUF, packed int4 and dense."""
    dtype = next(model.parameters()).dtype
    layers = []
    for layer, parts in zip(model.model.layers, read_layers(gguf, model), strict=True):
        linears = layer_linears(layer)
        built = {name: q4_projection(parts[name], linears[name], dtype, max_rows) for name in parts}
        layers.append(LayerProjections(**built))
    return layers


def with_crossover(
    layers: list[LayerProjections],
    head: Projection,
    weights: str,
    max_rows: int | None,
    cache: CompileCache | None = None,
) -> tuple[int, float | None]:
    """Sets the layers' and head's weight-only kernel limit: `max_rows`, or the measured
    crossovers (the head's no higher than the layers'), kept in `cache` when given (the
    compiled buckets are built on them); returns the layers' limit and, when measured, a
    layer's time on the kernel over the other packing's at one row."""
    head_rows, one_row = max_rows, None
    if max_rows is None:

        def measure() -> dict[str, object]:
            stack = stack_projections(layers)
            rows, ratios = small_max_rows(stack)
            head_rows, head_ratios = small_max_rows(
                [head], tuple(r for r in ROWS if r <= rows), before=stack
            )
            return {"layers": rows, "head": head_rows, "ratios": ratios, "head_ratios": head_ratios}

        if cache is None:
            found, how = measure(), "measured"
        else:
            key = {**platform_key(), "weights": weights, "shapes": crossover_shapes(layers, head)}
            found, fresh = cache.measured("crossover", key, measure)
            how = "measured" if fresh else "as measured before on this machine"
        max_rows, head_rows = int(found["layers"]), int(found["head"])
        ratios = {int(rows): ratio for rows, ratio in dict(found["ratios"]).items()}
        one_row = ratios.get(1)
        log.info(
            "weights %s: weight-only kernel up to %d rows, the lm_head's up to %d, %s "
            "(its time / dense by rows: layer %s, lm_head %s)",
            weights,
            max_rows,
            head_rows,
            how,
            found["ratios"],
            found["head_ratios"],
        )
    set_max_rows(layers, max_rows)
    head.max_rows = head_rows
    return max_rows, one_row


def crossover_shapes(layers: list[LayerProjections], head: Projection) -> list[object]:
    """What the crossover was timed on: the projections' shapes and dtypes."""
    projections = [*layer_projections(layers[0]), head]
    return [[p.out_features, p.in_features, str(p.dense.dtype)] for p in projections]


def build_runner(
    model: PreTrainedModel,
    setting: str,
    gguf: Path | None,
    max_rows: int | None = None,
    cache: CompileCache | None = None,
) -> LlamaRunner:
    """The runner on the weights TANDEM_WEIGHTS asks for, falling back to bf16 with a log line.

    `max_rows` fixes the weight-only kernel's row limit (tests); None measures it here, or
    takes the measurement `cache` kept.
    """
    setting = (setting or "auto").strip().lower()
    if setting not in CHOICES:
        raise ValueError(f"TANDEM_WEIGHTS must be one of {', '.join(CHOICES)}, not {setting!r}.")
    if setting == "bf16":
        return runner_for(model)
    if setting == "auto":
        return auto_runner(model, max_rows, cache)
    if setting in ("q8", "q4_1"):
        missing = q8_missing(model) if setting == "q8" else q4_1_missing(model, gguf)
        if missing is None:
            try:
                return own_kernel_runner(model, setting, gguf, max_rows, cache)
            except (ValueError, OSError) as exc:  # read_layers: the GGUF's tensors
                missing = (
                    f"{gguf.name} does not fit the model: {exc}"
                    if gguf is not None
                    else f"the weights do not fit the kernel: {exc}"
                )
        log.warning("weights: %s unavailable, using the dense weights: %s", setting, missing)
        return runner_for(model)
    if setting == "fp16":
        missing = fp16_missing(model)
        if missing is None:
            return fp16_runner(model)
        log.warning("weights: fp16 unavailable, using the dense weights: %s", missing)
        return runner_for(model)
    if setting == "int8":
        missing = int8_missing(model)
        if missing is None:
            layers, head = int8_layers(model, 0), int8_head(model)
            with_crossover(layers, head, "int8", max_rows, cache)
            return LlamaRunner(model, layers, weights="int8", head=head)
        log.warning("weights: int8 unavailable, using the dense weights: %s", missing)
        return runner_for(model)
    missing = q4_missing(model, gguf)
    if missing is None and gguf is not None:
        try:
            layers, head = q4_layers(model, gguf, 0), int8_head(model)
            with_crossover(layers, head, "q4", max_rows, cache)
            return LlamaRunner(model, layers, weights="q4", head=head)
        except (ValueError, OSError) as exc:
            missing = f"{gguf.name} does not fit the model: {exc}"
    log.warning("weights: q4 unavailable, using the dense weights: %s", missing)
    return runner_for(model)


def own_kernel_runner(
    model: PreTrainedModel,
    weights: str,
    gguf: Path | None,
    max_rows: int | None,
    cache: CompileCache | None,
) -> LlamaRunner:
    """The runner on q8 or q4_1 with its crossover set (warning when the kernel was built
    without vector instructions, where it is slow)."""
    layers, head = q8_projections(model) if weights == "q8" else q4_1_projections(model, gguf)
    with_crossover(layers, head, weights, max_rows, cache)
    if q8_instructions() == "scalar":
        log.warning(
            "weights: %s's kernel has no vector instructions on this CPU (it needs AVX2 at "
            "least) and runs slowly; fp16 or bf16 is faster",
            weights,
        )
    return LlamaRunner(model, layers, weights=weights, head=head)


def auto_runner(
    model: PreTrainedModel, max_rows: int | None, cache: CompileCache | None
) -> LlamaRunner:
    """auto: of the weight-only kernels this model can have here (q8, and int8 for a model not
    in float32), each with the other packing above its crossover, the one faster at one row
    (the first at a tie, or when none was timed); built one at a time, so a loser's matrices
    are freed before the next is built. Where none wins at one row, fp16 for a float32 model
    (where fbgemm runs), else bf16.

    q4_1 is not among them: it wins at one row but loses to q8 from two (its nibbles are
    unpacked per row of x), so it would slow every step of more than one stream below its
    crossover (docs/engine.md, "Weight formats")."""
    float32 = next(model.parameters()).dtype == torch.float32
    candidates = {
        "int8": (lambda: int8_missing(model), lambda: (int8_layers(model, 0), int8_head(model))),
        "q8": (lambda: q8_missing(model), lambda: q8_projections(model)),
    }
    if float32:  # int8 takes bfloat16 rows, which such a CPU emulates
        del candidates["int8"]
    best: tuple[float, str, list[LayerProjections], Projection] | None = None
    timed, reasons = [], []
    for name, (missing, build) in candidates.items():
        why = missing()
        if why is not None:
            reasons.append(f"{name}: {why}")
            continue
        layers, head = build()
        rows, one_row = with_crossover(layers, head, name, max_rows, cache)
        if rows == 0:
            reasons.append(f"{name}: its kernel is slower than the other packing at one row here")
            continue
        score = one_row if one_row is not None else len(timed)
        timed.append(f"{name} {score}")
        if best is None or score < best[0]:
            best = (score, name, layers, head)
        del layers, head
    if best is not None:
        if len(timed) > 1:
            log.info(
                "weights: %s taken, faster at one row here (layer time / other: %s)",
                best[1],
                ", ".join(timed),
            )
        return LlamaRunner(model, best[2], weights=best[1], head=best[3])
    log.info("weights: no weight-only kernel taken: %s", "; ".join(reasons))
    if float32 and fp16_missing(model) is None:
        return fp16_runner(model)
    return runner_for(model)
