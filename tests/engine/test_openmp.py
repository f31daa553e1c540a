"""The engine thread's OpenMP workers: a thread that ran torch kernels can let go of its own."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from inference.engine.openmp import release_thread_pool


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenMP starts no workers on one CPU")
def test_release_ends_the_calling_threads_workers() -> None:
    """A thread's parallel kernel leaves its OpenMP workers behind; releasing ends them,
    and the thread's next kernel builds them again and computes the same result."""
    before_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(512, 512)
        found: dict[str, object] = {}

        def work() -> None:
            found["idle"] = _os_threads()
            expected = a @ a
            found["with_pool"] = _os_threads()
            found["released"] = release_thread_pool()
            found["after"] = _os_threads()
            found["same"] = torch.equal(a @ a, expected)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before_threads)
    assert found["released"] is True
    assert found["with_pool"] > found["idle"]
    assert found["after"] < found["with_pool"]
    assert found["same"] is True
