"""How callers off the engine thread receive a request's events: async or blocking.

`EventStream` is the asyncio bridge, a request's events as an async iterator on the caller's
event loop; `BatchCollector` gathers one request's events for the blocking `generate_batch`.

The engine thread hands each event to the loop with `call_soon_threadsafe` into an unbounded
asyncio.Queue (the engine must never block on a slow client). When the consumer stops early
(breaks out of `async for`, is cancelled, or drops the iterator) the request is cancelled
in the engine, so an abandoned stream stops using a slot before the next step.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from inference.engine.events import EngineEvent, GenerationResult
from inference.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from inference.engine.engine import Engine

# What `Engine.generate_batch` takes per request: (request_id, prompt_ids, params).
BatchRequest = tuple[str | None, Iterable[int], SamplingParams | None]


class _Delivery:
    """The engine-side callback: it holds the loop and the queue, never the stream.

    Were the engine to hold the stream, a consumer dropping it could not get it collected
    (and so cancelled) before the request ended on its own.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        self._loop = loop
        self._queue = queue

    def __call__(self, event: EngineEvent) -> None:
        # Engine thread. If the loop is closed this raises, and the engine cancels the request.
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)


class EventStream:
    """`async for event in engine.stream(...)`; submitted on creation.

    Creating it raises the submission errors (InvalidRequest, PromptTooLong, Overloaded)
    synchronously, before any response has started. Iteration ends after the finish event.
    """

    def __init__(
        self,
        engine: Engine,
        prompt_ids: Iterable[int],
        params: SamplingParams | None,
        request_id: str | None,
    ) -> None:
        self._engine = engine
        self._queue: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self._finished = True  # until the submission succeeds there is nothing to cancel
        delivery = _Delivery(asyncio.get_running_loop(), self._queue)
        self.request_id = engine.submit(
            prompt_ids, params, on_event=delivery, request_id=request_id
        )
        self._finished = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> EngineEvent:
        if self._finished:
            raise StopAsyncIteration
        try:
            event = await self._queue.get()
        except asyncio.CancelledError:
            self._abandon()
            raise
        if event.is_finished:
            self._finished = True
        return event

    async def aclose(self) -> None:
        """Stop consuming; cancels the request if it has not finished."""
        self._abandon()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._abandon()

    def _abandon(self) -> None:
        if not self._finished:
            self._finished = True
            self._engine.cancel(self.request_id)

    def __del__(self) -> None:
        # A consumer that breaks out of `async for` just drops the iterator.
        if not getattr(self, "_finished", True):
            self._engine.cancel(self.request_id)


class BatchCollector:
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


def collect_batch(
    engine: Engine, requests: Iterable[BatchRequest], timeout: float | None
) -> list[GenerationResult]:
    """Submit all requests at once (all or none) and wait for every result, in order.

    On timeout the unfinished ones are cancelled and TimeoutError is raised.
    """
    collectors: list[BatchCollector] = []
    submissions = []
    for request_id, prompt_ids, params in requests:
        collector = BatchCollector()
        collectors.append(collector)
        submissions.append((request_id, prompt_ids, params, collector.on_event))
    request_ids = engine.submit_all(submissions)
    deadline = None if timeout is None else time.monotonic() + timeout
    for collector in collectors:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not collector.done.wait(remaining):
            for request_id in request_ids:
                engine.cancel(request_id)
            raise TimeoutError(f"generate_batch did not finish within {timeout} s")
    return [collector.result() for collector in collectors]
