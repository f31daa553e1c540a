"""Loading a resolved model directory into memory, once, with its tokenizer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from inference.provisioning import model_source
from inference.provisioning.dtype import pick_device, pick_dtype
from inference.provisioning.errors import ModelUnavailable


@dataclass
class LoadedModel:
    """A model ready for inference and the facts an operator wants to see about it."""

    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    dtype: torch.dtype
    device: torch.device
    parameters: int
    load_seconds: float
    converted_now: bool
    gguf: Path | None = None
    weights: str = "bf16"

    def describe(self) -> dict[str, object]:
        """A JSON-friendly summary for logs, /health and the ops page."""
        return {
            "name": self.name,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "parameters": self.parameters,
            "load_seconds": round(self.load_seconds, 2),
            "converted_now": self.converted_now,
            "weights": self.weights,
        }


def load(setting: str | None, dtype_setting: str = "auto", cache_dir=None) -> LoadedModel:
    """Resolve TANDEM_MODEL, convert the packaged GGUF if needed, and load it for inference."""
    started = time.perf_counter()
    source = model_source.resolve(setting, cache_dir=cache_dir)
    device = pick_device()
    dtype = pick_dtype(dtype_setting, device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.directory, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            source.directory, dtype=dtype, local_files_only=True
        )
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"Could not load the model from {source.directory}: {exc}") from exc
    model.to(device)
    model.eval()
    return LoadedModel(
        name=source.name,
        model=model,
        tokenizer=tokenizer,
        dtype=dtype,
        device=device,
        parameters=sum(p.numel() for p in model.parameters()),
        load_seconds=time.perf_counter() - started,
        converted_now=source.converted_now,
        gguf=source.gguf,
    )
