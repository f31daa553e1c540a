"""What an engine is configured with: its capacity limits and the token ids that end a request."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class EngineConfig:
    """Capacity limits. `max_seq_len` None means the model's context window.

    `kv_initial_tokens` is each KV slot's first capacity; None: the whole sequence length on
    the CPU (fresh zero pages take memory only where written, so no growth copies stall the
    decoders), 256 on an accelerator (grown by doubling).

    `kv_release_after_s`: on the CPU, the seconds an idle engine keeps its KV pages before
    giving them back (written pages stay while it works: faulting them in again cost every
    burst ~2.4 µs a page, 180 pages per 16 positions of a slot for SmolLM2).

    `prefill_multiple` bounds a step that feeds prompt tokens next to decoders to that many
    decode steps (pacing.py); None lets prefill take the whole `max_step_tokens`.

    `prefix_reuse`: a prompt starts after the longest start of it that a free slot's rows
    still hold (kv_cache.py), instead of prefilling those tokens again.
    """

    max_running: int = 32
    max_waiting: int = 256
    max_step_tokens: int = 512
    max_seq_len: int | None = None
    kv_initial_tokens: int | None = None
    prefill_multiple: float | None = 1.4
    kv_release_after_s: float = 30.0
    prefix_reuse: bool = True

    def validate(self) -> None:
        """Reject settings under which the loop could not make progress."""
        if self.max_running < 1 or self.max_waiting < 1 or (self.kv_initial_tokens or 1) < 1:
            raise ValueError("max_running, max_waiting and kv_initial_tokens must be >= 1.")
        if self.max_step_tokens < self.max_running:
            raise ValueError(
                "max_step_tokens must be >= max_running, so a step always has room for every "
                "decoder plus at least one prompt token."
            )
        if self.prefill_multiple is not None and self.prefill_multiple <= 1.0:
            raise ValueError("prefill_multiple must be > 1 (a step with prefill does more work).")
        if self.kv_release_after_s < 0:
            raise ValueError("kv_release_after_s must be >= 0.")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError("max_seq_len must be >= 2 (one prompt token and one new token).")


def eos_token_ids(
    model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase
) -> frozenset[int]:
    """EOS ids from the model's generation_config (an int or a list) plus the tokenizer's."""
    ids: set[int] = set()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos is not None:
        ids.update(eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
