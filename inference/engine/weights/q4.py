"""Reading a GGUF's Q4_1 linears straight into Q4Matrix, without dequantizing them.

A Q4_1 block is 20 bytes for 32 weights along a row: fp16 scale d, fp16 min m, then 16
bytes whose low nibbles are the block's first 16 values q and high nibbles the last 16
(checked against `gguf.quants.dequantize`); w = d·q + m. llama.cpp's converter permutes the
rows of Q and K for its rope layout; transformers' GGUF loader undoes it
(`LlamaTensorProcessor._reverse_permute_weights`), and so does `unpermute_rows` here, on
whole rows, so blocks, scales and mins move together.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import PreTrainedModel

from inference.engine.weights.layers import Weight, layer_linears
from inference.engine.weights.projection import GROUP, Q4Matrix

BLOCK_BYTES = 4 + GROUP // 2
GGUF_PARTS = {
    "qkv": ["attn_q", "attn_k", "attn_v"],
    "o": ["attn_output"],
    "gate_up": ["ffn_gate", "ffn_up"],
    "down": ["ffn_down"],
}


def read_q4_1(raw: np.ndarray) -> Q4Matrix:
    """A Q4_1 tensor's bytes [N, K/32·20] as q, scales and mins, no arithmetic on q."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, BLOCK_BYTES)
    scales = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0]
    mins = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0]
    packed = blocks[..., 4:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, -1)
    return Q4Matrix(
        torch.from_numpy(np.ascontiguousarray(q)),
        torch.from_numpy(scales.astype(np.float32)),
        torch.from_numpy(mins.astype(np.float32)),
    )


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's rope permutation of a Q or K weight."""
    half = rows // heads // 2
    order = np.arange(rows).reshape(heads, half, 2).swapaxes(2, 1).reshape(rows)
    return torch.from_numpy(np.ascontiguousarray(order))


def read_tensor(tensor: gguf.ReaderTensor) -> Weight:
    """Q4_1 as a Q4Matrix; any other kind dequantized by gguf to float32 [N, K]."""
    raw = np.asarray(tensor.data)
    if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1:
        return read_q4_1(raw)
    values = gguf.quants.dequantize(raw, tensor.tensor_type)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def read_layers(path: Path, model: PreTrainedModel) -> list[dict[str, list[Weight]]]:
    """Per decoder layer, each fused projection's parts as the GGUF holds them, in HF row order.

    Raises ValueError when the file lacks a tensor or its shapes do not match the model.
    """
    config = model.config
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(path).tensors}
    layers = []
    for index, layer in enumerate(model.model.layers):
        linears = layer_linears(layer)
        parts: dict[str, list[Weight]] = {}
        for fused, names in GGUF_PARTS.items():
            parts[fused] = []
            for name, linear in zip(names, linears[fused], strict=True):
                key = f"blk.{index}.{name}.weight"
                if key not in tensors:
                    raise ValueError(f"{path.name} has no tensor {key}")
                weight = read_tensor(tensors[key])
                shape = tuple(weight.q.shape if isinstance(weight, Q4Matrix) else weight.shape)
                if shape != tuple(linear.weight.shape):
                    raise ValueError(
                        f"{key} is {shape} in {path.name} but {tuple(linear.weight.shape)} "
                        "in the model"
                    )
                if name in heads and isinstance(weight, Q4Matrix):
                    weight = weight.take_rows(unpermute_rows(shape[0], heads[name]))
                elif name in heads:
                    weight = weight[unpermute_rows(shape[0], heads[name])]
                parts[fused].append(weight)
        layers.append(parts)
    return layers
