"""Choosing the compute dtype and device for the model.

bfloat16 halves memory traffic, but on a CPU without native bf16 instructions torch emulates
it and a matmul runs ~100x slower than float32 (measured on an AVX2-only EPYC: 70 vs 0.8
GFLOP/s). So `auto` only picks bfloat16 where the hardware has it.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHOICES = ("auto", "float32", "bfloat16")
BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}


def cpu_flags() -> set[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def pick_device() -> torch.device:
    """CUDA when present, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    """Resolve TANDEM_DTYPE (auto | float32 | bfloat16) for the device."""
    setting = (setting or "auto").strip().lower()
    if setting not in CHOICES:
        raise ValueError(f"TANDEM_DTYPE must be one of {', '.join(CHOICES)}, not {setting!r}.")
    if setting == "float32":
        return torch.float32
    if setting == "bfloat16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_flags() & BF16_CPU_FLAGS else torch.float32
