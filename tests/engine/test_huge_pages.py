"""The q8 weights' memory: copies on mappings the kernel may back with 2 MiB pages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.engine.weights import huge_pages, q8

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_eligible(address: int) -> bool:
    """What /proc/self/smaps says of the mapping holding `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("THPeligible:"):
            return line.split()[1] == "1"
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_placed_tensor_is_an_aligned_copy_that_outlives_the_arena_moving_on() -> None:
    tensor = torch.randn(1000, 576)
    placed = huge_pages.place(tensor)
    assert torch.equal(placed, tensor) and placed.data_ptr() != tensor.data_ptr()
    assert placed.data_ptr() % huge_pages.ALIGN == 0 and placed.is_contiguous()
    for _ in range(3):  # past the end of the mapping holding `placed`
        huge_pages.place(torch.zeros(huge_pages.CHUNK // 2, dtype=torch.int8))
    big = huge_pages.place(torch.full((huge_pages.CHUNK,), 7, dtype=torch.int8))
    assert torch.equal(placed, tensor) and int(big.sum()) == 7 * huge_pages.CHUNK
    assert huge_pages.place(torch.empty(0, 3)).shape == (0, 3)


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here"
)
def test_the_q8_weights_sit_on_memory_advised_for_huge_pages() -> None:
    matrix = q8.Q8Matrix(*q8.int8_rows(torch.randn(960, 576)))
    assert thp_eligible(matrix.tiled.data_ptr())
    assert not thp_eligible(torch.randn(960, 576).data_ptr())
