"""Compiled buckets kept on disk, so that a restart loads its graphs instead of building them.

A bucket's graph is an AOTInductor package (`.pt2`: the generated C++ built into a shared
library, with its frozen, prepacked weights). Building one takes 30-90 s of CPU; loading one
takes well under a second. inductor's own caches could not carry this step: the FX graph cache
refuses graphs that hold oneDNN-prepacked weights ("mkldnn tensors unpickleable"), the
AOTAutograd cache refuses frozen graphs, and even a hit leaves dynamo's trace and the freezing
passes, ~10 s a bucket (2-core AMD EPYC Zen 4, 2026-12-04).

An entry is valid only for what it was built from, so its key holds all of it: torch's and
transformers' versions, the CPU's instruction sets, the thread count baked into the OpenMP
loops, the engine's own source, the weights' bytes, dtype and kind, the bucket and every
kernel choice. The key's digest names the entry's directory, so another key is never read;
the entry repeats the whole key, and a `.pt2` is a zip whose members carry CRCs, so a
truncated or damaged file is found before it is loaded, rebuilt, and said in the log.
Processes of one machine share the directory: a file lock per bucket makes the second of two
processes starting together wait for the first's build and load it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
import transformers
from filelock import FileLock

from inference.engine.others_cpu import OthersCpu
from inference.engine.package_loading import load_graph

log = logging.getLogger(__name__)

ENGINE_SOURCE = Path(__file__).parent
# Instruction sets that change what inductor generates or which kernels it may call.
CPU_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# Entries (keys) kept beside the one in use: a changed setting or an upgrade leaves the old
# ones behind, each the size of a few copies of the weights.
KEEP_ENTRIES = 3


@cache
def cpu_flags() -> tuple[str, ...]:
    """The CPU_FLAGS this machine has (from /proc/cpuinfo; none where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            line = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return ()
    present = set(line.partition(":")[2].split())
    return tuple(flag for flag in CPU_FLAGS if flag in present)


@cache
def engine_source_digest() -> str:
    """sha256 of the engine's own source (Python and C++): its graphs are made from it."""
    digest = hashlib.sha256()
    for path in sorted(ENGINE_SOURCE.rglob("*")):
        if path.suffix in (".py", ".cpp", ".h"):
            digest.update(str(path.relative_to(ENGINE_SOURCE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def tensors_digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over named tensors' bytes, shapes and dtypes: which weights a graph froze."""
    digest = hashlib.sha256()
    for name, tensor in tensors:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        flat = tensor.detach().contiguous().cpu().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def platform_key() -> dict[str, object]:
    """The parts of a key that come from the machine and the installed packages."""
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": list(cpu_flags()),
        "threads": torch.get_num_threads(),
        "engine_source": engine_source_digest(),
    }


def key_digest(key: dict[str, object]) -> str:
    """The short name of a key: its entry's directory."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


@dataclass(slots=True)
class Loaded:
    """A bucket's graph, and how this process came by it."""

    graph: Callable[..., torch.Tensor]
    how: str  # "loaded" from the cache, or "built" here (and stored)
    seconds: float
    note: str = ""  # why it was built: no entry, or what was wrong with the one there


class CompileCache:
    """The compiled buckets of every key, under one directory shared by a machine's processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def entry(self, key: dict[str, object]) -> Path:
        """The directory holding `key`'s buckets."""
        return self.root / key_digest(key)

    def get(self, key: dict[str, object], bucket: int, build: Callable[[Path], None]) -> Loaded:
        """The bucket's graph for `key`: loaded from its entry when that is whole and was made
        for this key; otherwise `build(path)` writes the package and it is loaded from there.

        Held under the bucket's file lock, so two processes never build the same bucket.
        """
        entry = self.entry(key)
        entry.mkdir(parents=True, exist_ok=True)
        package, meta = entry / f"bucket-{bucket}.pt2", entry / f"bucket-{bucket}.json"
        started = time.perf_counter()
        with FileLock(str(entry / f"bucket-{bucket}.lock")):
            os.utime(entry)
            problem = self._problem(package, meta, key)
            if problem is None:
                try:
                    graph = load_graph(package)
                except Exception as exc:  # a package this torch cannot load is rebuilt
                    problem = f"it did not load ({type(exc).__name__}: {exc})".splitlines()[0]
                else:
                    return Loaded(graph, "loaded", time.perf_counter() - started)
            if problem != "no entry":
                log.warning(
                    "compiled step: bucket %d's cache entry in %s is unusable (%s); rebuilding",
                    bucket,
                    entry,
                    problem,
                )
            self._build(package, meta, key, build)
            graph = load_graph(package)
        self._prune()
        return Loaded(graph, "built", time.perf_counter() - started, problem)

    @staticmethod
    def _problem(package: Path, meta: Path, key: dict[str, object]) -> str | None:
        """Why the entry cannot be loaded, or None when it can."""
        if not meta.exists() or not package.exists():
            return "no entry"
        try:
            stored = json.loads(meta.read_text())
        except (OSError, ValueError) as exc:
            return f"its key file is unreadable: {exc}"
        if stored.get("key") != key:
            return "it was made for another key"
        if stored.get("bytes") != package.stat().st_size:
            return "the package's size differs from the one stored"
        try:
            with zipfile.ZipFile(package) as archive:
                damaged = archive.testzip()
        except (OSError, zipfile.BadZipFile) as exc:
            return f"the package is not a whole archive: {exc}"
        if damaged is not None:
            return f"the package's member {damaged} fails its checksum"
        return None

    @staticmethod
    def _build(
        package: Path, meta: Path, key: dict[str, object], build: Callable[[Path], None]
    ) -> None:
        """Build into a temporary name, then move it in: a reader never sees half a package,
        and the key file, written last, says the package is whole."""
        meta.unlink(missing_ok=True)
        partial = package.with_suffix(f".{os.getpid()}.partial.pt2")
        started = time.perf_counter()
        try:
            build(partial)
            os.replace(partial, package)
        finally:
            partial.unlink(missing_ok=True)
        record = {
            "key": key,
            "bytes": package.stat().st_size,
            "build_seconds": round(time.perf_counter() - started, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        temporary = meta.with_suffix(".json.partial")
        temporary.write_text(json.dumps(record, indent=1, sort_keys=True))
        os.replace(temporary, meta)

    def measured(
        self, name: str, key: dict[str, object], measure: Callable[[], dict[str, object]]
    ) -> tuple[dict[str, object], bool]:
        """A start-up measurement that a compiled graph is built on (the weight-only
        kernel's crossover): the one stored for `key`, else `measure()`'s, stored if the
        machine was quiet while it ran; and whether it was measured now.

        Measured anew at every start, a noisy reading could move the crossover, and with it
        the key of every bucket; kept, a restart builds on what its buckets were built on.
        A reading taken while other processes used the CPUs is used once and not kept: one
        taken beside a test suite (load 3.4 on 2 cores) read int8 23x slower than bf16 at one
        row, where it is ~3x faster."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{name}-{key_digest(key)}.json"
        with FileLock(str(path.with_suffix(".lock"))):
            try:
                stored = json.loads(path.read_text())
                if stored.get("key") == key:
                    return stored["value"], False
            except (OSError, ValueError, KeyError):
                pass  # absent or unreadable: measured again and written whole
            others = OthersCpu()
            value = measure()
            if not others.quiet():
                log.info(
                    "%s measured while other processes used %.2f CPUs: used now, not kept",
                    name,
                    others.cpus(),
                )
                return value, True
            temporary = path.with_suffix(".json.partial")
            temporary.write_text(json.dumps({"key": key, "value": value}, sort_keys=True))
            os.replace(temporary, path)
        return value, True

    def _prune(self) -> None:
        """Remove all but the KEEP_ENTRIES entries used last (an entry's time is its use)."""
        entries = sorted(
            (path for path in self.root.iterdir() if path.is_dir()),
            key=lambda path: path.stat().st_mtime,
            reverse=True,
        )
        for stale in entries[KEEP_ENTRIES:]:
            log.info("compiled step: removing the cache entry %s, unused the longest", stale)
            shutil.rmtree(stale, ignore_errors=True)
