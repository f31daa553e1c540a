"""Failure injection: make a share of renders fail on purpose, for demos and tests.

The failure is transient and comes halfway through, after real progress, so it exercises the
whole path a flaky backend takes: progress shown, retries with backoff, then a failed part
with a readable reason and a partial message.
"""

from __future__ import annotations

import random

from media.backends.base import ImageBackend, Progress, TransientImageError


class FailureInjecting:
    """Wraps a backend; each render fails with probability `rate` once it is half done."""

    def __init__(self, backend: ImageBackend, rate: float) -> None:
        self.backend = backend
        self.rate = rate

    def render(self, prompt: str, *, seed: int, on_progress: Progress) -> bytes:
        doomed = random.random() < self.rate

        def progress(fraction: float) -> None:
            on_progress(fraction)
            if doomed and fraction >= 0.5:
                raise TransientImageError(
                    f"injected failure (TANDEM_IMAGE_FAILURE_RATE={self.rate:g})"
                )

        return self.backend.render(prompt, seed=seed, on_progress=progress)
