"""The chat's sampling defaults, in one place: the web's replies and bench/sampling.py use them."""

from __future__ import annotations

from django.conf import settings

from inference.engine import SamplingParams

TOP_P = 0.9
REPETITION_PENALTY = 1.1


def chat_sampling() -> SamplingParams:
    """How a chat reply picks its tokens: length and temperature from settings."""
    return SamplingParams(
        max_new_tokens=settings.TANDEM_CHAT_MAX_NEW_TOKENS,
        do_sample=settings.TANDEM_CHAT_TEMPERATURE > 0,
        temperature=settings.TANDEM_CHAT_TEMPERATURE,
        top_p=TOP_P,
        repetition_penalty=REPETITION_PENALTY,
    )
