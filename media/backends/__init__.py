"""Image backends behind one interface (`base.ImageBackend`), chosen by TANDEM_IMAGE_BACKEND."""

from __future__ import annotations

from django.conf import settings

from media.backends.base import ImageBackend
from media.backends.failures import FailureInjecting
from media.backends.procedural import ProceduralBackend


def configured_backend() -> ImageBackend:
    """The backend the settings ask for, wrapped in failure injection when its rate is set."""
    backend: ImageBackend
    if settings.TANDEM_IMAGE_BACKEND == "diffusers":
        from media.backends.diffusers_backend import DiffusersBackend

        backend = DiffusersBackend(settings.TANDEM_IMAGE_MODEL_DIR, settings.TANDEM_IMAGE_STEPS)
    else:
        backend = ProceduralBackend(settings.TANDEM_IMAGE_STEPS, settings.TANDEM_IMAGE_STEP_DELAY)
    rate = settings.TANDEM_IMAGE_FAILURE_RATE
    return FailureInjecting(backend, rate) if rate > 0 else backend
