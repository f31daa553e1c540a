"""Incremental detokenisation: text pieces whose concatenation is exactly the full decode.

Token ids are decoded with tokenizers' DecodeStream, which withholds a piece until its bytes
form complete UTF-8, so a Korean syllable or an emoji split over several byte-level tokens
is never shown as U+FFFD. At the end, `flush` reconciles with one full decode, which yields
any text DecodeStream still holds (e.g. a dangling partial character).
"""

from __future__ import annotations

import logging

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids the tokenizer treats as special (skipped when decoding with skip_special_tokens)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
    return frozenset(ids)


class IncrementalDetokenizer:
    """Decodes one request's generated ids one token at a time."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._pieces: list[str] = []

    def step(self, token_id: int) -> str:
        """The new text this token completes ("" while a character is still incomplete)."""
        piece = self._stream.step(self._tokenizer.backend_tokenizer, token_id) or ""
        if piece:
            self._pieces.append(piece)
        return piece

    def flush(self, generated_ids: list[int]) -> str:
        """The rest of `decode(generated_ids, skip_special_tokens=True)` not yet returned."""
        full = self._tokenizer.decode(generated_ids, skip_special_tokens=True)
        emitted = "".join(self._pieces)
        if not full.startswith(emitted):
            logger.warning("Incremental decode diverged from the full decode; tail dropped.")
            return ""
        tail = full[len(emitted) :]
        if tail:
            self._pieces.append(tail)
        return tail
