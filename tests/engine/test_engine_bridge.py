"""The asyncio bridge: streaming events into a loop, and cancelling when the consumer leaves."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inference.engine import EngineObserver, FinishReason, PromptTooLong, SamplingParams
from tests.engine.helpers import WAIT

PROMPT = list(range(2000, 2012))
LONG = SamplingParams(max_new_tokens=200, ignore_eos=True)


class FinishWatcher(EngineObserver):
    """Signals, from the engine thread, when a request finishes and why."""

    def __init__(self) -> None:
        self.reasons: dict[str, FinishReason] = {}
        self.finished = threading.Event()

    def on_finish(self, request_id, reason, usage, timings) -> None:
        self.reasons[request_id] = reason
        self.finished.set()


def test_stream_yields_every_event_then_stops(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer)

    async def consume() -> list:
        events = []
        async for event in engine.stream(PROMPT, SamplingParams(max_new_tokens=12)):
            events.append(event)
        return events

    events = asyncio.run(asyncio.wait_for(consume(), WAIT))
    assert events[-1].is_finished and all(not e.is_finished for e in events[:-1])
    assert [e.index for e in events] == list(range(len(events)))
    token_ids = [e.token_id for e in events]
    assert "".join(e.text for e in events) == events[-1].full_text
    assert events[-1].full_text == tokenizer.decode(token_ids, skip_special_tokens=True)


def test_breaking_out_of_the_stream_cancels_the_request(tiny_model, tokenizer, make_engine) -> None:
    watcher = FinishWatcher()
    engine = make_engine(tiny_model, tokenizer, observer=watcher)

    async def consume_two() -> str:
        stream = engine.stream(PROMPT, LONG)
        request_id = stream.request_id
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        del stream  # what leaving the consumer's scope does
        # Still inside the running loop: the cancel must not wait for the loop to close.
        assert await asyncio.to_thread(watcher.finished.wait, WAIT)
        return request_id

    request_id = asyncio.run(asyncio.wait_for(consume_two(), WAIT))
    assert watcher.reasons == {request_id: FinishReason.CANCELLED}
    assert engine.stats().kv_tokens_used == 0


def test_cancelling_the_consumer_task_cancels_the_request(
    tiny_model, tokenizer, make_engine
) -> None:
    watcher = FinishWatcher()
    engine = make_engine(tiny_model, tokenizer, observer=watcher)

    async def scenario() -> str:
        first = asyncio.Event()
        stream = engine.stream(PROMPT, LONG)

        async def consume() -> None:
            async for _ in stream:
                first.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # `stream` is still referenced here, so the task's cancellation itself cancelled it.
        assert await asyncio.to_thread(watcher.finished.wait, WAIT)
        return stream.request_id

    request_id = asyncio.run(asyncio.wait_for(scenario(), WAIT))
    assert watcher.reasons == {request_id: FinishReason.CANCELLED}


def test_stream_raises_submission_errors_before_iterating(
    tiny_model, tokenizer, make_engine
) -> None:
    engine = make_engine(tiny_model, tokenizer, max_seq_len=16)

    async def open_stream() -> None:
        engine.stream(list(range(100, 140)), SamplingParams())

    with pytest.raises(PromptTooLong):
        asyncio.run(open_stream())


def test_concurrent_streams_share_the_engine(tiny_model, tokenizer, make_engine) -> None:
    engine = make_engine(tiny_model, tokenizer)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    expected = engine.generate_batch([(None, PROMPT, params)], timeout=WAIT)[0].token_ids

    async def collect() -> list[int]:
        return [e.token_id async for e in engine.stream(PROMPT, params)]

    async def many() -> list[list[int]]:
        return await asyncio.gather(*(collect() for _ in range(5)))

    assert asyncio.run(asyncio.wait_for(many(), WAIT)) == [expected] * 5
