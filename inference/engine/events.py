"""The events the engine emits per request per step, and what a finished request adds.

Times are `time.monotonic()` seconds: only differences between them mean anything, and they
are immune to wall-clock jumps. `created_wall` (time.time()) is there for logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FinishReason(StrEnum):
    """Why a request ended; the string values are what the HTTP layer reports."""

    LENGTH = "length"
    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    CANCELLED = "cancelled"
    ERROR = "error"
    # Never emitted by this engine: a remote engine's stream that dropped or stalled
    # (inference/provisioning/remote_engine.py), its text so far kept.
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request (the prompt as fed, after any truncation)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    """When a request was queued, admitted, got its first token and finished (monotonic s)."""

    created_wall: float
    queued_at: float
    admitted_at: float | None
    first_token_at: float | None
    finished_at: float

    @property
    def queue_time(self) -> float | None:
        """Seconds spent waiting for a slot."""
        return None if self.admitted_at is None else self.admitted_at - self.queued_at

    @property
    def ttft(self) -> float | None:
        """Time to first token, from submission."""
        return None if self.first_token_at is None else self.first_token_at - self.queued_at

    @property
    def duration(self) -> float:
        """Submission to finish."""
        return self.finished_at - self.queued_at


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One step's outcome for one request.

    A token event has `token_id`, its raw-model `logprob`, `index` (0-based position in the
    completion) and `text`: the piece a client may show now, possibly "" (a special token, an
    incomplete character, or text held back by a possible stop sequence). The last event of
    a request has `is_finished` and carries `finish_reason`, `usage`, `full_text` (the
    concatenation of every `text`) and `timings`. A cancel or error finish carries no token
    (`token_id` None, `index` = tokens generated so far); an error carries `error`.
    """

    request_id: str
    index: int
    token_id: int | None
    text: str
    logprob: float | None = None
    special: bool = False
    is_finished: bool = False
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    full_text: str | None = None
    timings: Timings | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """A finished request as `Engine.generate_batch` returns it."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    error: str | None = None
