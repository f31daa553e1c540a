"""The optional diffusers backend: a text-to-image pipeline from a local model directory.

It is in requirements.txt (so `make run` installs it); point TANDEM_IMAGE_MODEL_DIR
at a pipeline saved with `save_pretrained` (Stable Diffusion or anything DiffusionPipeline
loads). Nothing is downloaded: the directory is opened with local_files_only. The pipeline is
loaded once per worker process and kept; progress comes from its step-end callback.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from media.backends.base import PermanentImageError, Progress, TransientImageError, png_bytes


class DiffusersBackend:
    """Runs `steps` denoising steps of the pipeline in `model_dir`."""

    def __init__(self, model_dir: str, steps: int) -> None:
        self.model_dir = model_dir
        self.steps = steps

    def render(self, prompt: str, *, seed: int, on_progress: Progress) -> bytes:
        pipeline = load_pipeline(self.model_dir)
        import torch

        generator = torch.Generator(device=pipeline.device).manual_seed(seed)

        def on_step_end(_pipeline, step: int, _timestep, tensors: dict) -> dict:
            on_progress((step + 1) / self.steps)
            return tensors

        try:
            result = pipeline(
                prompt,
                num_inference_steps=self.steps,
                generator=generator,
                callback_on_step_end=on_step_end,
            )
        except torch.OutOfMemoryError as exc:
            raise TransientImageError("the GPU ran out of memory; trying again later") from exc
        return png_bytes(result.images[0])


@lru_cache(maxsize=1)
def load_pipeline(model_dir: str):
    """Load the pipeline once per process, on the GPU when there is one."""
    if not model_dir or not (Path(model_dir) / "model_index.json").is_file():
        raise PermanentImageError(
            f"no diffusers pipeline at TANDEM_IMAGE_MODEL_DIR={model_dir!r} "
            "(a directory written by save_pretrained, with model_index.json)"
        )
    try:
        import torch
        from diffusers import DiffusionPipeline
    except ImportError as exc:
        raise PermanentImageError(
            "the diffusers backend is not installed: "
            "pip install --require-hashes -r requirements.txt"
        ) from exc
    cuda = torch.cuda.is_available()
    pipeline = DiffusionPipeline.from_pretrained(
        model_dir,
        local_files_only=True,
        dtype=torch.float16 if cuda else torch.float32,
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to("cuda" if cuda else "cpu")
