"""The chat's sampling, in one place: the web's replies and bench/sampling.py use it.

A conversation's own settings (temperature, top-p, reply length) win; without one, the
settings' TANDEM_CHAT_* defaults. The repetition penalty is the same for every reply: a
small model loops without it (docs/chat.md, "Sampling defaults").
"""

from __future__ import annotations

from django.conf import settings

from chat.models import Conversation
from inference.engine import SamplingParams


def chat_sampling(conversation: Conversation | None = None) -> SamplingParams:
    """How a chat reply picks its tokens."""
    chosen = (conversation or Conversation()).effective_settings()
    return SamplingParams(
        max_new_tokens=chosen["max_new_tokens"],
        do_sample=chosen["temperature"] > 0,
        temperature=chosen["temperature"],
        top_p=chosen["top_p"],
        repetition_penalty=settings.TANDEM_CHAT_REPETITION_PENALTY,
    )
