"""One request's state inside the engine: token ids, progress through the KV cache, timings.

The state is token ids only (prompt + generated); text is derived from them incrementally and
never tokenised again.
"""

from __future__ import annotations

import operator
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from enum import Enum

import torch
from transformers import PreTrainedTokenizerBase

from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.errors import InvalidRequest, PromptTooLong
from inference.engine.events import EngineEvent, FinishReason, Timings, Usage
from inference.engine.sampling import RequestSampler, SamplingParams
from inference.engine.stop import StopMatcher

EventCallback = Callable[[EngineEvent], None]
# What `Engine.submit_all` takes per request: (request_id, prompt_ids, params, on_event).
Request = tuple[str | None, Iterable[int], SamplingParams | None, EventCallback]


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

    def cached_ids(self) -> list[int]:
        """The tokens whose K/V its slot holds: the first `num_computed` of prompt + output."""
        return (self.prompt_ids + self.output_ids)[: self.num_computed]

    @property
    def text(self) -> str:
        """Every piece of text released so far."""
        return "".join(self.text_parts)

    def append_token(self, token: int, now: float) -> float | None:
        """Record a sampled token; the gap since the previous one (None for the first)."""
        previous = self.last_token_at
        self.output_ids.append(token)
        self.sampler.observe(token)
        self.last_token_at = now
        if previous is None:
            self.first_token_at = now
            return None
        return now - previous

    def release_text(self, eos_ids: frozenset[int]) -> tuple[str, FinishReason | None]:
        """The text the newest token lets a client see now, and why the request ends, if it does.

        A stop string ends it first; at EOS or the length limit the detokeniser's and the stop
        matcher's held-back text is released too (it may still complete a stop string).
        """
        token = self.output_ids[-1]
        text = self.stop.push(self.detokenizer.step(token))
        reason = None
        if self.stop.stopped:
            reason = FinishReason.STOP_SEQUENCE
        elif token in eos_ids and not self.params.ignore_eos:
            reason = FinishReason.EOS_TOKEN
        elif len(self.output_ids) >= self.max_new_tokens:
            reason = FinishReason.LENGTH
        if reason is FinishReason.EOS_TOKEN or reason is FinishReason.LENGTH:
            text += self.stop.push(self.detokenizer.flush(self.output_ids))
            text += self.stop.flush()
            if self.stop.stopped:
                reason = FinishReason.STOP_SEQUENCE
        self.text_parts.append(text)
        return text, reason

    def token_event(self, text: str, logprob: float, special: bool) -> EngineEvent:
        """The event of the newest token."""
        index = len(self.output_ids) - 1
        return EngineEvent(self.request_id, index, self.output_ids[-1], text, logprob, special)

    def final_event(
        self, reason: FinishReason, finished_at: float, last: EngineEvent | None, error: str | None
    ) -> EngineEvent:
        """The request's last event: its final token's event `last` closed with the totals, or
        a token-less one (cancel, error) at `index` = tokens generated so far."""
        base = last or EngineEvent(self.request_id, len(self.output_ids), None, "")
        return replace(
            base,
            is_finished=True,
            finish_reason=reason,
            usage=self.usage(),
            full_text=self.text,
            timings=self.timings(finished_at),
            error=error,
        )

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


def prepare_sequence(
    request: Request,
    tokenizer: PreTrainedTokenizerBase,
    vocab_size: int,
    max_seq_len: int,
    device: torch.device,
) -> Sequence:
    """Validate, truncate or refuse the prompt, and cap max_new_tokens by the context."""
    request_id, prompt_ids, params, on_event = request
    params = params or SamplingParams()
    params.validate()
    try:
        ids = [operator.index(token) for token in prompt_ids]
    except TypeError as exc:
        raise InvalidRequest("prompt_ids must be integers.") from exc
    if not ids:
        raise InvalidRequest("The prompt is empty.")
    if any(not 0 <= token < vocab_size for token in ids):
        raise InvalidRequest(f"prompt_ids must be in [0, {vocab_size}).")
    max_prompt = max_seq_len - 1
    if params.truncate_prompt_tokens is not None:
        ids = ids[-min(params.truncate_prompt_tokens, max_prompt) :]
    elif len(ids) > max_prompt:
        raise PromptTooLong(len(ids), max_prompt)
    return Sequence(
        request_id=request_id or uuid.uuid4().hex,
        prompt_ids=ids,
        params=params,
        max_new_tokens=min(params.max_new_tokens, max_seq_len - len(ids)),
        sampler=RequestSampler(params, ids, vocab_size, device),
        detokenizer=IncrementalDetokenizer(tokenizer),
        on_event=on_event,
    )
