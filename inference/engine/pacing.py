"""How many prompt tokens a step may feed while others decode (Sarathi-style chunked prefill).

A step that feeds a 512-token prompt chunk next to 31 decoders makes all 31 wait for it:
their next token comes ten times later than usual. The pacer keeps a step with prefill
within `multiple` times a decode-only step of the same decoders: it measures what decoding
costs (per decoder-count bucket) and what each prefill token adds, and gives prefill the
tokens that fit in the difference. With no one decoding there is no one to stall, so
prefill gets the whole step budget. The long prompt's time to first token is the price.

The per-token figure includes a chunk's fixed cost (a chunk pass reads every weight once), so
it overestimates for small chunks; budget and figure then move to the fixed point where a
step with prefill takes `multiple` decode steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SMOOTHING = 0.2


def _bucket(decoders: int) -> int:
    """Decode steps are timed per power-of-two decoder count: time grows with the count."""
    return 1 << max(decoders - 1, 0).bit_length()


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


@dataclass
class PrefillPacer:
    """Prefill token budget per step, from measured decode-step and prefill-token costs."""

    max_tokens: int
    multiple: float | None = 1.6
    min_tokens: int = 8
    decode_seconds: dict[int, float] = field(default_factory=dict)
    token_seconds: float | None = None

    def budget(self, decoders: int) -> int:
        """Prompt tokens the next step may feed next to `decoders` decoding sequences."""
        if decoders == 0 or self.multiple is None:
            return self.max_tokens
        decode = self.decode_seconds.get(_bucket(decoders))
        if decode is None or self.token_seconds is None:
            return self.min_tokens
        if self.token_seconds <= 0.0:
            return self.max_tokens  # prefill added nothing measurable: try a whole chunk
        tokens = int((self.multiple - 1.0) * decode / self.token_seconds)
        return max(self.min_tokens, min(self.max_tokens, tokens))

    def observe(self, decoders: int, prefill_tokens: int, seconds: float) -> None:
        """Learn from a finished step: a decode step's cost, or what its prefill added."""
        if decoders == 0:
            return  # nobody waited on this step; a whole-budget chunk's cost says little
        key = _bucket(decoders)
        if prefill_tokens == 0:
            self.decode_seconds[key] = _ema(self.decode_seconds.get(key), seconds)
            return
        decode = self.decode_seconds.get(key)
        if decode is not None:
            added = max(seconds - decode, 0.0) / prefill_tokens
            self.token_seconds = _ema(self.token_seconds, added)
