"""The engine: one background thread running the step loop over the scheduler and runner.

Each iteration applies cancellations, then steps: schedule (admitting waiting requests), one
forward pass, sample a token per sampling row, append each to its request (text, stop
conditions, freeing a finished request's KV at once), emit the events. Callers talk to it from
any thread through `submit`, `cancel`, `generate_batch` and (asyncio) `stream`; the request's
own bookkeeping is the Sequence's, the batched sampling maths `sampling.py`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from functools import partial

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from inference.engine.batch import StepBatch
from inference.engine.bridge import BatchRequest, EventStream, collect_batch
from inference.engine.closing import Closing, describe
from inference.engine.config import EngineConfig, eos_token_ids
from inference.engine.cut_in import CutIn
from inference.engine.detokenizer import special_token_ids
from inference.engine.errors import EngineStopped, InvalidRequest, StepInterrupted
from inference.engine.events import EngineEvent, FinishReason, GenerationResult
from inference.engine.heap import keep_freed_memory
from inference.engine.kv_cache import KVCache
from inference.engine.model_runner import ModelRunner, runner_for
from inference.engine.observer import EngineObserver
from inference.engine.openmp import release_thread_pool
from inference.engine.pacer_seeding import seed_pacer
from inference.engine.pacing import PrefillPacer
from inference.engine.sampling import (
    SamplingParams,
    chosen_logprobs,
    greedy_tokens,
    rows_of,
    sample_rows,
)
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import EventCallback, Request, Sequence, Status, prepare_sequence
from inference.engine.stats import Counters, EngineStats, snapshot
from inference.engine.step_attention import ArrivalFlag

logger = logging.getLogger(__name__)

# A KV slot's first capacity on an accelerator, where storage is real memory from the start.
GPU_KV_TOKENS = 256
GPU_KV_SLOTS = 4


class Engine(CutIn, Closing):
    """Continuous-batching inference over one model; all model work on one thread.

    A newcomer's prompt may run inside the step in flight (`CutIn`, cut_in.py); every way a
    request ends is `Closing`'s (closing.py).

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
        on_cpu = runner.kv_spec.device.type == "cpu"
        initial = self.config.kv_initial_tokens
        if initial is None:
            initial = self.max_seq_len if on_cpu else GPU_KV_TOKENS
        slots = self.config.max_running if on_cpu else GPU_KV_SLOTS
        self.cache = KVCache(
            runner.kv_spec, self.config.max_running, self.max_seq_len, initial, slots
        )
        self.scheduler = Scheduler(
            self.cache,
            self.config.max_running,
            self.config.max_waiting,
            self.config.max_step_tokens,
            self.config.prefix_reuse,
        )
        self.pacer = PrefillPacer(
            self.config.max_step_tokens,
            self.config.prefill_multiple,
            reference_rows=self.config.max_running,
        )
        self._pacer_seeded = False
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.special_ids = special_token_ids(tokenizer)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._active: dict[str, Sequence] = {}
        self._cancels: set[str] = set()
        self._arrived = ArrivalFlag()
        self._paused_seconds = 0.0  # time steps spent running a newcomer's step inside
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._counts = Counters()

    # ----- lifecycle -----

    def start(self) -> Engine:
        """Start the loop thread (idempotent).

        The model runs on the loop thread from here on: the caller's OpenMP workers (left
        by loading the model) are released so they do not slow the loop's, and the loop
        releases its own whenever it goes idle (openmp.py). On the CPU, malloc keeps what a
        step frees for the next (heap.py).
        """
        release_thread_pool()
        if self.cache.pages is not None:  # the CPU cache
            keep_freed_memory()
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
        return self.submit_all([(request_id, prompt_ids, params, on_event)])[0]

    def submit_all(self, requests: Iterable[Request]) -> list[str]:
        """Queue `(request_id, prompt_ids, params, on_event)` requests: all, or none on an error."""
        vocab_size, device = self.runner.vocab_size, self.runner.kv_spec.device
        sequences = [
            prepare_sequence(request, self.tokenizer, vocab_size, self.max_seq_len, device)
            for request in requests
        ]
        with self._lock:
            if self._stopping:
                raise EngineStopped("The engine has been shut down.")
            ids = [seq.request_id for seq in sequences]
            if len(set(ids)) != len(ids) or any(i in self._active for i in ids):
                raise InvalidRequest("request_id is already in use.")
            self.scheduler.add(sequences)
            for seq in sequences:
                self._active[seq.request_id] = seq
            self._arrived.set()
            self._wake.notify_all()
        return ids

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
        requests: Iterable[BatchRequest],
        timeout: float | None = None,
    ) -> list[GenerationResult]:
        """Submit all requests at once (all or none) and wait for every result, in order.

        On timeout the unfinished ones are cancelled and TimeoutError is raised.
        """
        return collect_batch(self, requests, timeout)

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
        return snapshot(self.scheduler, self.cache, self._counts)

    # ----- the loop (engine thread only from here on) -----

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    if not self._has_work():
                        release_thread_pool()  # idle: other threads' kernels get every core
                    while not self._has_work():
                        self._wait_idle()
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

    def _wait_idle(self) -> None:
        """Wait for work (the lock held); an empty CPU cache gives its pages back after
        `kv_release_after_s` of it."""
        holding = self.cache.holds_pages  # no work: every slot is free
        timeout = self.config.kv_release_after_s if holding else None
        if not self._wake.wait(timeout) and holding:
            self.cache.release_pages()

    def _has_work(self) -> bool:
        """Whether the loop should run (the lock held): a step, a cancel or the stop."""
        return self._stopping or bool(self._cancels) or self.scheduler.has_work()

    def _recover(self, exc: Exception) -> None:
        """Fail every running request and start again from an empty cache.

        After a fault outside the model call the slot bookkeeping cannot be trusted; the
        waiting queue is kept.
        """
        for seq in self.scheduler.reset():
            self._finish(seq, FinishReason.ERROR, error=describe(exc))

    def _apply_cancels(self, request_ids: set[str]) -> None:
        for request_id in request_ids:
            seq = self._active.get(request_id)
            if seq is not None and seq.status is not Status.FINISHED:
                self._finish(seq, FinishReason.CANCELLED)

    def _step(self) -> None:
        """One iteration: schedule, then run the batch. A newcomer's prompt may run inside it
        (`_cut_in`); if that moved the cache's rows (StepInterrupted), the batch runs again."""
        batch = self._schedule()
        if batch is None:
            return
        try:
            self._run(batch)
        except StepInterrupted:
            self._run(batch)

    def _run(self, batch: StepBatch) -> None:
        """forward → sample → append → emit, then count the step (net of a newcomer's step
        run inside it)."""
        started, paused = time.monotonic(), self._paused_seconds
        logits = self._forward(batch)
        tokens = None if logits is None else self._sample(batch, logits)
        if tokens is None:
            return
        events = self._append(batch, tokens, chosen_logprobs(logits, tokens))
        for seq, event in events:
            self._emit(seq, event)
        inside = self._paused_seconds - paused
        self._count_step(batch, time.monotonic() - started - inside)

    def _schedule(self) -> StepBatch | None:
        """The scheduler's plan for this step, admitting waiting requests into free slots."""
        if not self._pacer_seeded:
            self._pacer_seeded = seed_pacer(self.pacer, self.runner)
        decoders = self.scheduler.decoders()
        with self._lock:
            self._arrived.clear()
            if self.scheduler.burst_pending():
                batch = self.scheduler.schedule()
            else:
                starting = self.scheduler.starting()
                after_alone = self.scheduler.after_alone
                batch = self._plan_alone(decoders, starting)
                if batch is None:
                    start = self.scheduler.next_start()
                    tokens, keys = self.pacer.plan(decoders, start, starting)
                    batch = self.scheduler.schedule(tokens, keys)
                    if batch is not None and not after_alone:
                        batch.interrupt = partial(self._cut_in, batch)
                        batch.arrivals = self._arrived
        if batch is not None:
            self._admitted(batch)
        return batch

    def _forward(self, batch: StepBatch) -> torch.Tensor | None:
        """One logits row per sampling sequence; None when the pass failed its whole batch."""
        try:
            return self.runner.forward(batch, self.cache)
        except StepInterrupted:
            raise
        except Exception as exc:
            self._fail_batch(batch, exc)
            return None

    def _sample(self, batch: StepBatch, logits: torch.Tensor) -> dict[int, int] | None:
        """A token per row, keyed by row; a row whose sampler fails fails its request alone."""
        samplers = [seq.sampler for seq in batch.samplers]
        try:
            tokens = greedy_tokens(logits, samplers)
        except Exception as exc:
            self._fail_batch(batch, exc)
            return None
        rest = [row for row in range(len(samplers)) if row not in tokens]
        if not rest:
            return tokens
        try:
            drawn = sample_rows(rows_of(logits, rest), [samplers[row] for row in rest])
            tokens.update(zip(rest, drawn, strict=True))
        except Exception:  # find the row that failed: each on its own, the others still sampled
            for row in rest:
                try:
                    tokens[row] = samplers[row].sample(logits[row])
                except Exception as exc:
                    self._fail_row(batch.samplers[row], exc)
        return dict(sorted(tokens.items()))

    def _append(
        self, batch: StepBatch, tokens: dict[int, int], logprobs: list[float]
    ) -> list[tuple[Sequence, EngineEvent]]:
        """Give each request its token; the events to emit, in row order."""
        events = []
        for row, logprob in zip(tokens, logprobs, strict=True):
            seq = batch.samplers[row]
            try:
                events.append((seq, self._append_token(seq, tokens[row], logprob)))
            except Exception as exc:
                self._fail_row(seq, exc)
        return events

    def _append_token(self, seq: Sequence, token: int, logprob: float) -> EngineEvent:
        """Append a token, release its text, and close the request if it ends there."""
        now = time.monotonic()
        gap = seq.append_token(token, now)
        if gap is None:
            self._observe("on_first_token", seq.request_id, now - seq.queued_at)
        self._observe("on_token", seq.request_id, gap)
        text, reason = seq.release_text(self.eos_ids)
        event = seq.token_event(text, logprob, token in self.special_ids)
        return event if reason is None else self._close(seq, reason, last=event)

    def _count_step(self, batch: StepBatch, seconds: float) -> None:
        self.pacer.observe(
            len(batch.decode_slots), batch.num_prefill_tokens, seconds, batch.num_prefill_keys
        )
        self._counts.steps += 1
        self._counts.tokens_generated += len(batch.samplers)
        self._counts.prompt_tokens_processed += batch.num_prefill_tokens
        self._observe(
            "on_step", len(batch.sequences), batch.num_tokens, batch.num_prefill_tokens, seconds
        )

    def _observe(self, method: str, *args: object) -> None:
        try:
            getattr(self.observer, method)(*args)
        except Exception:
            logger.exception("Engine observer %s failed", method)
