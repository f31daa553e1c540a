"""One request's state inside the engine: token ids, progress through the KV cache, timings.

The state is token ids only (prompt + generated); text is derived from them incrementally and
never tokenised again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum

from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.events import EngineEvent, Timings, Usage
from inference.engine.sampling import RequestSampler, SamplingParams
from inference.engine.stop import StopMatcher

EventCallback = Callable[[EngineEvent], None]


class Status(Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request from submission to finish.

    `num_computed` counts the tokens whose K/V are in the cache. While it is below the
    prompt length the request is prefilling; afterwards each step feeds the last generated
    token (the only one not yet in the cache) and samples the next.
    """

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        sampler: RequestSampler,
        detokenizer: IncrementalDetokenizer,
        on_event: EventCallback,
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.output_ids: list[int] = []
        self.params = params
        self.max_new_tokens = max_new_tokens
        self.sampler = sampler
        self.detokenizer = detokenizer
        self.stop = StopMatcher(params.stop)
        self.on_event = on_event
        self.status = Status.WAITING
        self.slot = -1
        self.num_computed = 0
        self.text_parts: list[str] = []
        self.created_wall = time.time()
        self.queued_at = time.monotonic()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to be fed."""
        return self.num_computed < len(self.prompt_ids)

    @property
    def total_len(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_ids) + len(self.output_ids)

    def usage(self) -> Usage:
        """Token counts so far."""
        return Usage(len(self.prompt_ids), len(self.output_ids))

    def timings(self, finished_at: float) -> Timings:
        """The request's time stamps, closed at `finished_at`."""
        return Timings(
            created_wall=self.created_wall,
            queued_at=self.queued_at,
            admitted_at=self.admitted_at,
            first_token_at=self.first_token_at,
            finished_at=finished_at,
        )
