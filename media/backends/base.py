"""The one small interface every image backend implements, and the errors it may raise.

A backend turns a prompt into PNG bytes and reports progress as it goes; it knows nothing
about parts, tasks or storage. Its errors say whether trying again could help, which is all
the rendering service needs to choose between a retry and a failure.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from typing import Protocol

from PIL import Image

Progress = Callable[[float], None]


class ImageError(Exception):
    """A render failed; the message is shown to the user, so it is written for a person."""


class TransientImageError(ImageError):
    """Trying again later could succeed (a busy device, a flaky dependency)."""


class PermanentImageError(ImageError):
    """Trying again cannot help (a missing model, an unusable prompt)."""


class ImageBackend(Protocol):
    """Draws one image for a prompt."""

    def render(self, prompt: str, *, seed: int, on_progress: Progress) -> bytes:
        """Return a PNG; call `on_progress` with fractions rising to 1.0 while working.

        `on_progress` may raise to stop the render early (the part was cancelled); a backend
        lets that exception through.
        """
        ...


def prompt_seed(prompt: str) -> int:
    """A stable 32-bit seed from the prompt, so the same words give the same picture."""
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")


def png_bytes(image: Image.Image) -> bytes:
    """Encode an image as PNG."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
