"""Where a bench ran: the CPU (name, vendor, family/model, the instruction sets that pick
kernels) and what the engine chose on it (weights, dtype, attention, the q8 kernel's build).

The same code runs at very different speeds on an AVX2-only EPYC, an AVX-512 one and a Xeon
with AMX, so every result file names its CPU the way /proc/cpuinfo does; the docs' tables are
grouped by it (`bench.results_page.kind`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from inference.engine.model_runner import LlamaRunner
from inference.engine.weights.q8 import q8_instructions

# The /proc/cpuinfo flags that change which kernel runs (torch's, oneDNN's, ours, llama.cpp's);
# "amx" stands for amx_tile.
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx")


def cpu_facts() -> dict:
    """This machine's CPU (Linux: the first processor of /proc/cpuinfo)."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if not line.strip():
            break
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    flags |= {"amx"} if "amx_tile" in flags else set()
    vendor = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}.get(fields.get("vendor_id", ""), "")
    return {
        "name": fields.get("model name", ""),
        "vendor": vendor or fields.get("vendor_id", "unknown"),
        "family": int(fields.get("cpu family", "0")),
        "model": int(fields.get("model", "0")),
        "flags": {flag: flag in flags for flag in FLAGS},
    }


def _q8_instructions() -> str:
    """What the q8 kernel was built for here, or why there is none."""
    try:
        return q8_instructions()
    except Exception as exc:  # no compiler or no build: the bench still runs, and says so
        return f"unavailable ({type(exc).__name__})"


def describe(runner: LlamaRunner) -> dict:
    """The CPU, torch's view of it, and the kinds the runner chose here."""
    return cpu_facts() | {
        "torch": torch.__version__,
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "q8_instructions": _q8_instructions(),
        "weights": runner.weights,
        "dtype": str(next(runner.model.parameters()).dtype).replace("torch.", ""),
        "attention": runner.attention_kind,
        "chunk_attention": runner.chunk_kind,
    }


def line(cpu: dict) -> str:
    """One line for the bench's log."""
    isa = " ".join(flag for flag, present in cpu["flags"].items() if present)
    return f"{cpu['name']} (family {cpu['family']} model {cpu['model']}; {isa})"
