"""The C++ kernels (attention in `decode_attention.cpp` and `chunk_attention.cpp`, the compiled
step's attention op in `step_attention.cpp`, the int8 weight kernels in `q8_linear.cpp` and
`q4_1_linear.cpp`) as one module, built at start by
torch's extension loader for this CPU's instructions.

The build (~40 s on two cores, kept under ~/.cache/tandem/extensions in a folder named by a
hash of the sources, the flags and torch's version, so a change builds anew) needs ninja and
a C++ compiler. Where it fails, each user of the module says why once and keeps a kernel of
torch's (`native_attention.py`, `weights/q8.py`, `weights/q4_1.py`). The instructions follow
ATen's CPU capability, so `ATEN_CPU_CAPABILITY=avx2` (or `default`) builds the AVX2 (scalar)
kernels on a CPU that has more: the tests run each path on one machine that way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from functools import cache
from pathlib import Path
from types import ModuleType

import platformdirs
import torch

HERE = Path(__file__).parent
SOURCES = [
    HERE / "decode_attention.cpp",
    HERE / "chunk_attention.cpp",
    HERE / "chunk_tiles.cpp",
    HERE / "q8_linear.cpp",
    HERE / "q4_1_linear.cpp",
    HERE / "step_attention.cpp",
    HERE / "bindings.cpp",  # the module that binds them
]
HEADERS = [
    HERE / "activation_blocks.h",
    HERE / "attention_kernels.h",
    HERE / "linear_kernels.h",
    HERE / "matrix_registry.h",
    HERE / "step_attention.h",
    HERE / "vector_rows.h",
]
NAME = "tandem_native"
# The instruction sets ATen's vector types are written for, as torch builds them.
CAPABILITY_FLAGS = {
    "AVX512": [
        "-DCPU_CAPABILITY_AVX512",
        *("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"),
    ],
    "AVX2": ["-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}
# A build takes ~40 s on two cores; a lock this old was left by a process that died.
STALE_LOCK_SECONDS = 600


def build_flags() -> list[str]:
    """The compiler's flags for this CPU: ATen's capability, and VNNI's int8 dot product
    (`vpdpbusd`, q8_linear.cpp) on an AVX-512 CPU that has it."""
    capability = torch.backends.cpu.get_cpu_capability()
    # OpenMP: without it at::parallel_for runs on one thread; the library is torch's own
    # libgomp, already loaded under the same soname.
    flags = ["-O3", "-fopenmp", *CAPABILITY_FLAGS.get(capability, [])]
    if capability == "AVX512" and torch.cpu._is_vnni_supported():
        flags.append("-mavx512vnni")
    return flags


@cache
def native_module() -> ModuleType:
    """The module for this CPU: loaded from its build folder when built before, else compiled
    there first; once a process (a failure is not kept: the next caller tries again)."""
    flags = build_flags()
    text = "".join(path.read_text() for path in SOURCES + HEADERS)
    key = hashlib.sha256(f"{text}{flags}{torch.__version__}".encode()).hexdigest()
    folder = Path(platformdirs.user_cache_dir("tandem")) / "extensions" / f"{NAME}-{key[:16]}"
    library = folder / f"{NAME}.so"
    if library.exists():
        try:
            return _import(library)
        except ImportError:  # cut short by a process killed while linking: build anew
            library.unlink()
    _compile(folder, flags)
    return _import(library)


def _import(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(folder: Path, flags: list[str]) -> None:
    """Build with torch's loader, which takes a lock file in the folder while it builds.

    A process killed while building leaves that file behind, and the loader would wait on
    it for ever: a lock older than any build is removed first. A built library is loaded
    without the loader (`native_module`), so a process killed later holds no lock.
    """
    # Imported here: it pulls in setuptools, which only a build needs.
    from torch.utils.cpp_extension import load

    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
        lock.unlink(missing_ok=True)
    if shutil.which("ninja") is None:  # a venv's python run without its bin on PATH
        import ninja

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    load(
        NAME,
        [str(path) for path in SOURCES],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
    )
