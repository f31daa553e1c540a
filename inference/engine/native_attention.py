"""Attention as small C++ kernels, built at start by torch's extension loader: decode rows
(`decode_attention.cpp`) and prompt chunks (`chunk_attention.cpp`, docs/engine.md "Prompt
chunks in C++"), one module (`attention_bindings.cpp`).

Inductor's loops for `grouped_attention` are latency-bound on these CPUs: each score is a
64-wide dot product ended by a horizontal sum, and each output a single chain of
multiply-adds over the keys. On a 2-core Xeon with AMX (2026-12-03), 31 decode rows over a
bfloat16 cache took 13.4 / 45.1 / 76.5 / 131.5 ms a step of 30 layers over 64 / 320 / 576 /
1,024 keys, ~1 ms a layer with the keys already in cache: the decoders' own step doubled
from 55 to 102 ms as their histories grew from 72 to 307 keys during the head-of-line run.
The kernel keeps a (sequence, KV head)'s queries in registers, reads each key and value row
once for all of them, and runs the weighted sum on as many accumulators as there are query
heads: 6.6 / 26.5 / 46.0 / 79.6 ms, and at one row 1.24 against 2.09 ms for torch's fused
kernel (320 keys). It sums in one order whatever the rows, so a request's output is the same
alone and beside others, one row included. The chunk kernel puts a chunk's queries in a
vector's lanes instead: late in a long prompt (8 rows over 2,000 keys) it took half the fused
kernel's time, and a prompt comes out the same bits however it is cut.

The build (~30 s, kept under ~/.cache/tandem/extensions in a folder named by a hash of the
sources, the flags and torch's version, so a change builds anew) needs ninja and a C++
compiler; where it fails, or the cache's dtype or head size does not fit, the runner keeps
the compiled kernel (`decode_attention.CompiledAttention`) for decode rows and torch's fused
kernel for prompt chunks, and says why once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType

import platformdirs
import torch

from inference.engine.decode_attention import Kernel
from inference.engine.kv_cache import KVSpec

HERE = Path(__file__).parent
SOURCES = [
    HERE / "decode_attention.cpp",
    HERE / "chunk_attention.cpp",
    HERE / "attention_bindings.cpp",  # the module that binds both kernels
]
HEADERS = [HERE / "attention_kernels.h", HERE / "vector_rows.h"]
NAME = "tandem_attention"
# The instruction sets ATen's vector types are written for, as torch builds them.
CAPABILITY_FLAGS = {
    "AVX512": [
        "-DCPU_CAPABILITY_AVX512",
        *("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"),
    ],
    "AVX2": ["-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}
DTYPES = (torch.float32, torch.bfloat16)
# (q [n, kv_heads, groups, head_dim], keys, values [kv_heads, keys, head_dim], start, scale):
# row r of a chunk at `start` attends keys 0 .. start + r (chunk_attention.cpp).
ChunkKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]
# A build takes ~30 s on two cores; a lock this old was left by a process that died.
STALE_LOCK_SECONDS = 600


def native_kernel(spec: KVSpec, groups: int) -> Kernel:
    """The built decode kernel for this cache, or an exception saying why there is none."""
    module = _checked(spec)
    if groups > module.max_groups:
        raise ValueError(f"{groups} query heads per KV head, the kernel takes {module.max_groups}")
    return module.decode_attention


def native_chunk_kernel(spec: KVSpec) -> ChunkKernel:
    """The built prompt-chunk kernel for this cache, or an exception saying why there is none."""
    return _checked(spec).chunk_attention


def _checked(spec: KVSpec) -> ModuleType:
    """The built module, where its kernels take this cache; else ValueError saying why."""
    if spec.device.type != "cpu":
        raise ValueError(f"the kernel is for the CPU, the cache is on {spec.device.type}")
    if spec.dtype not in DTYPES:
        raise ValueError(f"the kernel reads float32 or bfloat16, the cache is {spec.dtype}")
    module = _build()
    width = module.vector_width
    if spec.head_dim % width or spec.head_dim > width * module.max_vectors:
        raise ValueError(
            f"head_dim {spec.head_dim}: the kernel takes multiples of {width} "
            f"up to {width * module.max_vectors}"
        )
    return module


@cache
def _build() -> ModuleType:
    """The extension for this CPU's vector width: loaded from its build folder when built
    before, else compiled there first; once a process (a failure is not kept: the next
    runner tries again)."""
    capability = torch.backends.cpu.get_cpu_capability()
    # OpenMP: without it at::parallel_for runs on one thread; the library is torch's own
    # libgomp, already loaded under the same soname.
    flags = ["-O3", "-fopenmp", *CAPABILITY_FLAGS.get(capability, [])]
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
    without the loader (`_build`), so a process killed later holds no lock.
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
