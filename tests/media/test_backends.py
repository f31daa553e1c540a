"""The image backends on their own: procedural drawing, failure injection, diffusers."""

from __future__ import annotations

import importlib.util
import io
import json
import time

import pytest
from PIL import Image

from media.backends import configured_backend
from media.backends.base import PermanentImageError, TransientImageError, prompt_seed
from media.backends.failures import FailureInjecting
from media.backends.procedural import ProceduralBackend

HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def render(backend, prompt: str) -> tuple[bytes, list[float]]:
    progress: list[float] = []
    png = backend.render(prompt, seed=prompt_seed(prompt), on_progress=progress.append)
    return png, progress


def test_procedural_draws_the_same_png_for_the_same_prompt_in_steps():
    backend = ProceduralBackend(steps=5, step_delay=0.02)
    started = time.monotonic()
    first, progress = render(backend, "a red fox in the snow")
    assert time.monotonic() - started >= 5 * 0.02
    assert progress == [0.2, 0.4, 0.6, 0.8, 1.0]
    again, _ = render(backend, "a red fox in the snow")
    other, _ = render(backend, "a blue whale")
    assert first == again
    assert other != first
    image = Image.open(io.BytesIO(first))
    assert (image.format, image.size) == ("PNG", (512, 512))
    assert len(image.getcolors(maxcolors=1 << 20)) > 50  # a picture, not a flat fill


def test_injected_failures_come_halfway_and_are_transient():
    doomed = FailureInjecting(ProceduralBackend(steps=4, step_delay=0), rate=1.0)
    progress: list[float] = []
    with pytest.raises(TransientImageError, match="injected failure"):
        doomed.render("x", seed=1, on_progress=progress.append)
    assert progress == [0.25, 0.5]
    spared, progress = render(FailureInjecting(ProceduralBackend(4, 0), rate=0.0), "x")
    assert spared.startswith(b"\x89PNG") and progress[-1] == 1.0


def test_the_settings_choose_the_backend(settings):
    settings.TANDEM_IMAGE_STEPS = 7
    backend = configured_backend()
    assert isinstance(backend, ProceduralBackend) and backend.steps == 7
    settings.TANDEM_IMAGE_FAILURE_RATE = 0.25
    wrapped = configured_backend()
    assert isinstance(wrapped, FailureInjecting) and wrapped.rate == 0.25
    settings.TANDEM_IMAGE_FAILURE_RATE = 0.0
    settings.TANDEM_IMAGE_BACKEND = "diffusers"
    settings.TANDEM_IMAGE_MODEL_DIR = "/nowhere"
    assert type(configured_backend()).__name__ == "DiffusersBackend"


def test_diffusers_without_a_model_directory_is_a_permanent_error(tmp_path):
    from media.backends.diffusers_backend import DiffusersBackend

    with pytest.raises(PermanentImageError, match="no diffusers pipeline at"):
        render(DiffusersBackend(str(tmp_path / "missing"), steps=2), "x")


def save_tiny_pipeline(directory) -> None:
    """A randomly initialised Stable Diffusion pipeline of a few kilobytes, built here.

    Its tokenizer is a byte-level CLIP vocabulary with no merges, written on the spot, so
    nothing is downloaded.
    """
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(4, 8),
        norm_num_groups=2,
        attention_head_dim=2,
        cross_attention_dim=8,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    )
    vae = AutoencoderKL(
        sample_size=16,
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(4,),
        norm_num_groups=2,
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
    )
    symbols = sorted(ByteLevel.alphabet())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for token in symbols + [symbol + "</w>" for symbol in symbols]:
        vocab[token] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=16
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(vocab),
            hidden_size=8,
            intermediate_size=16,
            num_attention_heads=2,
            num_hidden_layers=1,
            max_position_embeddings=16,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        )
    )
    pipeline = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=DDIMScheduler(clip_sample=False, steps_offset=1),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(directory / "pipeline")


@pytest.mark.skipif(
    not HAS_DIFFUSERS,
    reason="diffusers is not installed (it is in requirements.txt)",
)
def test_diffusers_renders_a_tiny_random_pipeline_with_step_progress(tmp_path):
    from media.backends.diffusers_backend import DiffusersBackend, load_pipeline

    save_tiny_pipeline(tmp_path)
    backend = DiffusersBackend(str(tmp_path / "pipeline"), steps=3)
    try:
        png, progress = render(backend, "a red fox in the snow")
        again, _ = render(backend, "a red fox in the snow")
    finally:
        load_pipeline.cache_clear()
    assert progress == pytest.approx([1 / 3, 2 / 3, 1.0])
    image = Image.open(io.BytesIO(png))
    assert (image.format, image.size) == ("PNG", (16, 16))
    assert png == again  # the prompt's seed makes it repeatable
