"""What one step feeds the model: decode tokens and prefill chunks, planned by the scheduler.

The numeric fields are all a runner needs; the sequence lists are the scheduler's and the
engine's bookkeeping (who was in the step, whose logits row is whose).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference.engine.sequence import Sequence

if TYPE_CHECKING:
    from inference.engine.step_attention import ArrivalFlag


@dataclass(slots=True)
class PrefillChunk:
    """Prompt tokens [start, start + len(token_ids)) of the sequence in `slot`."""

    slot: int
    start: int
    token_ids: list[int]
    needs_logits: bool


@dataclass(slots=True)
class StepBatch:
    """One forward pass. Logits rows: one per decode token, then one per chunk needing logits.

    Decode token i is fed at `decode_positions[i]` for the sequence in `decode_slots[i]`;
    decode slots are in ascending order.
    """

    decode_slots: list[int] = field(default_factory=list)
    decode_token_ids: list[int] = field(default_factory=list)
    decode_positions: list[int] = field(default_factory=list)
    chunks: list[PrefillChunk] = field(default_factory=list)
    sequences: list[Sequence] = field(default_factory=list)
    samplers: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    # Asked with the layer index before each layer's attention; it may run a newcomer's
    # prompt there (`Engine._cut_in`). True abandons the step (StepInterrupted): that
    # prompt's step moved the cache's rows. None: nothing runs inside the step.
    interrupt: Callable[[int], bool] | None = None
    # The engine's flag, set when a request arrives: `interrupt` need only be asked while it
    # is set (the compiled step's C++ attention op reads it between layers).
    arrivals: ArrivalFlag | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens fed this step (decode tokens plus prefill chunk tokens)."""
        return len(self.decode_token_ids) + sum(len(c.token_ids) for c in self.chunks)

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt tokens fed this step."""
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def num_prefill_keys(self) -> int:
        """Keys the prompt chunks attend, summed over their tokens (size x end per chunk)."""
        return sum(len(c.token_ids) * (c.start + len(c.token_ids)) for c in self.chunks)
