"""A compiled bucket's package loaded, without leaving its unpacked copy on disk.

torch unpacks an AOTInductor package (`.pt2`) into a directory of its own under /tmp
(`aotinductor_*`: the shared library and the frozen weights) and removes it only when the
loader is destroyed, which a process that exits or is killed with its graphs alive never
does: every start of a web process left its twelve buckets' copies behind, 2.7 GB with
SmolLM2, until the machine's disk was full (289 directories, 66 GB, on one machine in one
day of benchmarks and test runs). Once loaded, the library and weights are mapped into the
process, and Linux keeps a removed file's pages while they are mapped, so the directories
this process maps files from (`/proc/self/maps`) are removed at once. Another process's
copies are never touched: only what this process has mapped is named there.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch._inductor.package import load_package

# One nested call: a newcomer's step may run inside a step in flight (`interrupt`), and it
# may use the same bucket.
RUNNERS = 2
UNPACKED_PREFIX = "aotinductor_"  # torch's name for a package's unpacked directory
MAPS = Path("/proc/self/maps")


def load_graph(package: Path) -> Callable[..., torch.Tensor]:
    """The package's graph, ready to run, with its unpacked copy already removed."""
    graph = load_package(str(package), num_runners=RUNNERS)
    for folder in unpacked_folders():
        shutil.rmtree(folder, ignore_errors=True)
    return graph


def unpacked_folders() -> set[Path]:
    """The unpacked packages' directories this process maps files from (removed ones too);
    none where the system has no /proc."""
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return set()
    folders = set()
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        for parent in Path(fields[5].removesuffix(" (deleted)")).parents:
            if parent.name.startswith(UNPACKED_PREFIX):
                folders.add(parent)
    return folders
