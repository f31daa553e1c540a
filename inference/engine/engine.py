"""The engine: one background thread running the step loop over the scheduler and runner.

Each iteration: apply cancellations, let the scheduler plan a step (admitting waiting
requests), run one forward pass, sample one token per sampling row, detokenise, check stop
conditions, emit events, and free finished requests' KV at once. Callers talk to it from
any thread through `submit`, `cancel`, `generate_batch` and (asyncio) `stream`.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from inference.engine.bridge import EventStream
from inference.engine.detokenizer import IncrementalDetokenizer, special_token_ids
from inference.engine.errors import EngineStopped, InvalidRequest, PromptTooLong
from inference.engine.events import EngineEvent, FinishReason, GenerationResult
from inference.engine.kv_cache import KVCache
from inference.engine.model_runner import ModelRunner, runner_for
from inference.engine.observer import EngineObserver
from inference.engine.sampling import RequestSampler, SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import EventCallback, Sequence, Status

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Capacity limits. `max_seq_len` None means the model's context window."""

    max_running: int = 32
    max_waiting: int = 256
    max_step_tokens: int = 512
    max_seq_len: int | None = None
    kv_initial_tokens: int = 256

    def validate(self) -> None:
        """Reject settings under which the loop could not make progress."""
        if self.max_running < 1 or self.max_waiting < 1 or self.kv_initial_tokens < 1:
            raise ValueError("max_running, max_waiting and kv_initial_tokens must be >= 1.")
        if self.max_step_tokens < self.max_running:
            raise ValueError(
                "max_step_tokens must be >= max_running, so a step always has room for every "
                "decoder plus at least one prompt token."
            )
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError("max_seq_len must be >= 2 (one prompt token and one new token).")


@dataclass(frozen=True)
class EngineStats:
    """A cheap snapshot for /health, the ops page and metrics gauges."""

    running: int
    waiting: int
    kv_tokens_used: int
    kv_tokens_capacity: int
    kv_tokens_max: int
    kv_bytes_allocated: int
    kv_slots_used: int
    kv_slots_max: int
    steps: int
    tokens_generated: int
    prompt_tokens_processed: int
    requests_finished: int


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


class _Collector:
    """Gathers one request's events for the blocking `generate_batch`."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.final: EngineEvent | None = None
        self.done = threading.Event()

    def on_event(self, event: EngineEvent) -> None:
        if event.token_id is not None:
            self.token_ids.append(event.token_id)
        if event.is_finished:
            self.final = event
            self.done.set()

    def result(self) -> GenerationResult:
        final = self.final
        assert final is not None and final.finish_reason is not None
        assert final.usage is not None and final.timings is not None
        return GenerationResult(
            request_id=final.request_id,
            token_ids=self.token_ids,
            text=final.full_text or "",
            finish_reason=final.finish_reason,
            usage=final.usage,
            timings=final.timings,
            error=final.error,
        )


class Engine:
    """Continuous-batching inference over one model; all model work on one thread.

    `model` may be None when a `runner` is injected (tests, fault injection); EOS ids then
    come from the tokenizer alone.
    """

    def __init__(
        self,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        config: EngineConfig | None = None,
        *,
        observer: EngineObserver | None = None,
        runner: ModelRunner | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.config.validate()
        if runner is None:
            if model is None:
                raise ValueError("Engine needs a model or a runner.")
            runner = runner_for(model)
        self.runner = runner
        self.tokenizer = tokenizer
        self.observer = observer or EngineObserver()
        context = runner.context_length
        self.max_seq_len = min(self.config.max_seq_len or context, context)
        self.cache = KVCache(
            runner.kv_spec, self.config.max_running, self.max_seq_len, self.config.kv_initial_tokens
        )
        self.scheduler = Scheduler(
            self.cache,
            self.config.max_running,
            self.config.max_waiting,
            self.config.max_step_tokens,
        )
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.special_ids = special_token_ids(tokenizer)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._active: dict[str, Sequence] = {}
        self._cancels: set[str] = set()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._steps = 0
        self._tokens_generated = 0
        self._prompt_tokens = 0
        self._finished = 0

    # ----- lifecycle -----

    def start(self) -> Engine:
        """Start the loop thread (idempotent)."""
        with self._lock:
            if self._stopping:
                raise EngineStopped("The engine has been shut down.")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="tandem-engine", daemon=True
                )
                self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop after the current step; unfinished requests get an error event."""
        with self._lock:
            self._stopping = True
            thread = self._thread
            self._wake.notify_all()
        if thread is threading.current_thread():
            return  # called from a callback: the loop exits after this step
        if thread is not None:
            thread.join(timeout)
        else:
            self._fail_remaining()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ----- requests -----

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of a plain string prompt (chat templates are the caller's business)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def submit(
        self,
        prompt_ids: Iterable[int],
        params: SamplingParams | None = None,
        *,
        on_event: EventCallback,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; `on_event` is called on the engine thread for every event.

        Raises InvalidRequest / PromptTooLong (bad request), Overloaded (queue full),
        EngineStopped. The callback must be quick and must not call `generate_batch`.
        """
        seq = self._prepare(prompt_ids, params, on_event, request_id)
        self._enqueue([seq])
        return seq.request_id

    def stream(
        self,
        prompt_ids: Iterable[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> EventStream:
        """Submit now and return an async iterator of this request's events (asyncio only)."""
        return EventStream(self, prompt_ids, params, request_id)

    def generate_batch(
        self,
        requests: Iterable[tuple[str | None, Iterable[int], SamplingParams | None]],
        timeout: float | None = None,
    ) -> list[GenerationResult]:
        """Submit all requests at once (all or none) and wait for every result, in order.

        On timeout the unfinished ones are cancelled and TimeoutError is raised.
        """
        collectors: list[_Collector] = []
        sequences: list[Sequence] = []
        for request_id, prompt_ids, params in requests:
            collector = _Collector()
            sequences.append(self._prepare(prompt_ids, params, collector.on_event, request_id))
            collectors.append(collector)
        self._enqueue(sequences)
        deadline = None if timeout is None else time.monotonic() + timeout
        for collector in collectors:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not collector.done.wait(remaining):
                for seq in sequences:
                    self.cancel(seq.request_id)
                raise TimeoutError(f"generate_batch did not finish within {timeout} s")
        return [collector.result() for collector in collectors]

    def cancel(self, request_id: str) -> bool:
        """Cancel before the next step; False if the request is unknown or already finished."""
        with self._lock:
            if request_id not in self._active:
                return False
            self._cancels.add(request_id)
            self._wake.notify_all()
        return True

    def stats(self) -> EngineStats:
        """Counters and KV use (read without stopping the loop; may be one step stale)."""
        lengths = list(self.cache.lengths)
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_tokens_used=sum(lengths),
            kv_tokens_capacity=self.cache.capacity_tokens,
            kv_tokens_max=self.cache.max_tokens,
            kv_bytes_allocated=self.cache.allocated_bytes,
            kv_slots_used=len(lengths),
            kv_slots_max=self.cache.max_slots,
            steps=self._steps,
            tokens_generated=self._tokens_generated,
            prompt_tokens_processed=self._prompt_tokens,
            requests_finished=self._finished,
        )

    def _prepare(
        self,
        prompt_ids: Iterable[int],
        params: SamplingParams | None,
        on_event: EventCallback,
        request_id: str | None,
    ) -> Sequence:
        """Validate, truncate or refuse the prompt, and cap max_new_tokens by the context."""
        params = params or SamplingParams()
        params.validate()
        try:
            ids = [operator.index(token) for token in prompt_ids]
        except TypeError as exc:
            raise InvalidRequest("prompt_ids must be integers.") from exc
        vocab = self.runner.vocab_size
        if not ids:
            raise InvalidRequest("The prompt is empty.")
        if any(not 0 <= token < vocab for token in ids):
            raise InvalidRequest(f"prompt_ids must be in [0, {vocab}).")
        max_prompt = self.max_seq_len - 1
        if params.truncate_prompt_tokens is not None:
            ids = ids[-min(params.truncate_prompt_tokens, max_prompt) :]
        elif len(ids) > max_prompt:
            raise PromptTooLong(len(ids), max_prompt)
        return Sequence(
            request_id=request_id or uuid.uuid4().hex,
            prompt_ids=ids,
            params=params,
            max_new_tokens=min(params.max_new_tokens, self.max_seq_len - len(ids)),
            sampler=RequestSampler(params, ids, vocab, self.runner.kv_spec.device),
            detokenizer=IncrementalDetokenizer(self.tokenizer),
            on_event=on_event,
        )

    def _enqueue(self, sequences: list[Sequence]) -> None:
        with self._lock:
            if self._stopping:
                raise EngineStopped("The engine has been shut down.")
            ids = [seq.request_id for seq in sequences]
            if len(set(ids)) != len(ids) or any(i in self._active for i in ids):
                raise InvalidRequest("request_id is already in use.")
            self.scheduler.add(sequences)
            for seq in sequences:
                self._active[seq.request_id] = seq
            self._wake.notify_all()

    # ----- the loop (engine thread only from here on) -----

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not (self._stopping or self._cancels or self.scheduler.has_work()):
                        self._wake.wait()
                    if self._stopping:
                        break
                    cancels, self._cancels = self._cancels, set()
                try:
                    self._apply_cancels(cancels)
                    self._step()
                except Exception as exc:
                    logger.exception("Engine loop fault; failing the running requests")
                    self._recover(exc)
            self._fail_remaining()

    def _recover(self, exc: Exception) -> None:
        """Fail every running request and start again from an empty cache.

        After a fault outside the model call the slot bookkeeping cannot be trusted; the
        waiting queue is kept.
        """
        for seq in self.scheduler.reset():
            self._finish(seq, FinishReason.ERROR, error=_describe(exc))

    def _apply_cancels(self, request_ids: set[str]) -> None:
        for request_id in request_ids:
            seq = self._active.get(request_id)
            if seq is not None and seq.status is not Status.FINISHED:
                self._finish(seq, FinishReason.CANCELLED)

    def _step(self) -> None:
        with self._lock:
            batch = self.scheduler.schedule()
        if batch is None:
            return
        for seq in batch.admitted:
            self._observe("on_admit", seq.request_id, seq.admitted_at - seq.queued_at)
        started = time.monotonic()
        try:
            logits = self.runner.forward(batch, self.cache)
            greedy_rows = [r for r, s in enumerate(batch.samplers) if s.sampler.plain_greedy]
            greedy = {}
            if greedy_rows:
                picks = logits[greedy_rows].argmax(-1).tolist()
                greedy = dict(zip(greedy_rows, picks, strict=True))
        except Exception as exc:
            logger.exception("Step failed; failing its %d requests", len(batch.sequences))
            for seq in batch.sequences:
                self._finish(seq, FinishReason.ERROR, error=_describe(exc))
            return
        tokens: dict[int, int] = {}
        for row, seq in enumerate(batch.samplers):
            try:
                tokens[row] = greedy[row] if row in greedy else seq.sampler.sample(logits[row])
            except Exception as exc:
                self._fail_row(seq, exc)
        for row, logprob in zip(tokens, _chosen_logprobs(logits, tokens), strict=True):
            seq = batch.samplers[row]
            try:
                self._advance(seq, tokens[row], logprob)
            except Exception as exc:
                self._fail_row(seq, exc)
        self._steps += 1
        self._tokens_generated += len(batch.samplers)
        self._prompt_tokens += batch.num_prefill_tokens
        self._observe(
            "on_step",
            len(batch.sequences),
            batch.num_tokens,
            batch.num_prefill_tokens,
            time.monotonic() - started,
        )

    def _fail_row(self, seq: Sequence, exc: Exception) -> None:
        """A fault in one row's sampling or post-processing fails that request only."""
        logger.exception("Post-processing failed for request %s", seq.request_id)
        if seq.status is not Status.FINISHED:
            self._finish(seq, FinishReason.ERROR, error=_describe(exc))

    def _advance(self, seq: Sequence, token: int, logprob: float) -> None:
        """Append a sampled token, turn it into releasable text, and finish if it ends."""
        now = time.monotonic()
        previous = seq.last_token_at
        seq.output_ids.append(token)
        seq.sampler.observe(token)
        seq.last_token_at = now
        if previous is None:
            seq.first_token_at = now
            self._observe("on_first_token", seq.request_id, now - seq.queued_at)
        self._observe("on_token", seq.request_id, None if previous is None else now - previous)

        text = seq.stop.push(seq.detokenizer.step(token))
        reason = None
        if seq.stop.stopped:
            reason = FinishReason.STOP_SEQUENCE
        elif token in self.eos_ids and not seq.params.ignore_eos:
            reason = FinishReason.EOS_TOKEN
        elif len(seq.output_ids) >= seq.max_new_tokens:
            reason = FinishReason.LENGTH
        if reason is FinishReason.EOS_TOKEN or reason is FinishReason.LENGTH:
            text += seq.stop.push(seq.detokenizer.flush(seq.output_ids))
            text += seq.stop.flush()
            if seq.stop.stopped:
                reason = FinishReason.STOP_SEQUENCE
        seq.text_parts.append(text)
        special = token in self.special_ids
        if reason is not None:
            self._finish(seq, reason, token_id=token, text=text, logprob=logprob, special=special)
            return
        event = EngineEvent(
            request_id=seq.request_id,
            index=len(seq.output_ids) - 1,
            token_id=token,
            text=text,
            logprob=logprob,
            special=special,
        )
        self._emit(seq, event)

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        *,
        token_id: int | None = None,
        text: str = "",
        logprob: float | None = None,
        special: bool = False,
        error: str | None = None,
    ) -> None:
        """Free the request's KV and queue place now, then emit its final event."""
        if seq.status is Status.RUNNING:
            self.scheduler.release(seq)
        elif seq.status is Status.WAITING:
            with self._lock:
                self.scheduler.remove_waiting(seq)
        seq.status = Status.FINISHED
        with self._lock:
            self._active.pop(seq.request_id, None)
        timings = seq.timings(time.monotonic())
        usage = seq.usage()
        generated = len(seq.output_ids)
        event = EngineEvent(
            request_id=seq.request_id,
            index=generated - 1 if token_id is not None else generated,
            token_id=token_id,
            text=text,
            logprob=logprob,
            special=special,
            is_finished=True,
            finish_reason=reason,
            usage=usage,
            full_text="".join(seq.text_parts),
            timings=timings,
            error=error,
        )
        self._finished += 1
        self.scheduler.record_duration(timings.duration)
        self._observe("on_finish", seq.request_id, reason, usage, timings)
        self._emit(seq, event)

    def _emit(self, seq: Sequence, event: EngineEvent) -> None:
        """Deliver an event; a failing callback cancels its request, never the engine."""
        try:
            seq.on_event(event)
        except Exception:
            logger.exception("on_event for request %s failed; cancelling it", seq.request_id)
            if not event.is_finished:
                self.cancel(seq.request_id)

    def _observe(self, method: str, *args: object) -> None:
        try:
            getattr(self.observer, method)(*args)
        except Exception:
            logger.exception("Engine observer %s failed", method)

    def _fail_remaining(self) -> None:
        """On shutdown: every unfinished request gets an error event."""
        with self._lock:
            pending = list(self._active.values())
        for seq in pending:
            if seq.status is not Status.FINISHED:
                self._finish(seq, FinishReason.ERROR, error="The engine shut down.")


def _chosen_logprobs(logits: torch.Tensor, tokens: dict[int, int]) -> list[float]:
    """Log-probability of each chosen token under the raw logits, for all rows at once.

    One logsumexp and one gather instead of a full [rows, vocab] log_softmax plus a tensor
    index per row.
    """
    if not tokens:
        return []
    rows = torch.tensor(list(tokens), device=logits.device)
    picked = torch.tensor(list(tokens.values()), device=logits.device)
    chosen = logits[rows, picked] - logits[rows].logsumexp(-1)
    return chosen.tolist()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
