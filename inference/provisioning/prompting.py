"""Turning chat messages into prompt token ids through the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict]) -> list[int]:
    """Render the template as text, then encode it without adding specials twice."""
    if tokenizer.chat_template is None:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    else:
        text = tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )
    return tokenizer.encode(text, add_special_tokens=False)
