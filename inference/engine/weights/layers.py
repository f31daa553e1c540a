"""A decoder layer's projections as the runner calls them: fused QKV and gate/up, o and down.

Fusing the three attention projections into one matmul (and gate with up) reads the same
input once and makes one kernel call instead of three (or two): at one row a call's fixed
cost is a large share of its time (figures in docs/engine.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from inference.engine.weights.projection import Projection, Q4Matrix

Weight = Q4Matrix | torch.Tensor


@dataclass(frozen=True)
class LayerProjections:
    """One decoder layer's linears; qkv's output is [q | k | v], gate_up's [gate | up]."""

    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection


def layer_linears(layer: nn.Module) -> dict[str, list[nn.Linear]]:
    """The HF modules behind each fused projection, in output order."""
    attention, mlp = layer.self_attn, layer.mlp
    return {
        "qkv": [attention.q_proj, attention.k_proj, attention.v_proj],
        "o": [attention.o_proj],
        "gate_up": [mlp.gate_proj, mlp.up_proj],
        "down": [mlp.down_proj],
    }


def _bias(linears: list[nn.Linear]) -> torch.Tensor | None:
    """The modules' biases side by side (zeros for one without), or None if none has one."""
    if all(linear.bias is None for linear in linears):
        return None
    return torch.cat(
        [
            linear.bias.detach()
            if linear.bias is not None
            else linear.weight.new_zeros(linear.out_features)
            for linear in linears
        ]
    )


def dense_projection(linears: list[nn.Linear]) -> Projection:
    """The modules fused as one dense weight; their own weights become views of it.

    So the fused weight costs no second copy, and the HF model (which the benchmarks' peers
    and the parity tests run) keeps computing with the same values.
    """
    if len(linears) == 1:
        linear = linears[0]
        bias = None if linear.bias is None else linear.bias.detach()
        return Projection(linear.weight.detach(), bias)
    weight = torch.cat([linear.weight.detach() for linear in linears])
    bias = _bias(linears)
    offset = 0
    for linear in linears:
        rows = slice(offset, offset + linear.out_features)
        linear.weight.data = weight[rows]
        if linear.bias is not None and bias is not None:
            linear.bias.data = bias[rows]
        offset += linear.out_features
    return Projection(weight, bias)


def q4_projection(
    weights: list[Weight], linears: list[nn.Linear], dtype: torch.dtype, max_rows: int
) -> Projection:
    """Fused projection from GGUF weights: both packings when every part is Q4_1.

    A part of another kind (a Q6_K or F16 tensor some GGUFs mix in) makes the fused weight
    dense only, dequantized by gguf to the compute dtype.
    """
    bias = _bias(linears)
    if bias is not None:
        bias = bias.to(dtype)
    if all(isinstance(weight, Q4Matrix) for weight in weights):
        return Projection.from_q4(Q4Matrix.cat(weights), bias, dtype, max_rows)
    dense = [w.dequantize() if isinstance(w, Q4Matrix) else w.float() for w in weights]
    return Projection(torch.cat(dense).to(dtype), bias)
