"""The text writer (chat/text_stream.py) fed with engine events by hand: no model, real DB and
Redis. Each piece gets the next seq, goes to the live tail and to the browsers; the text is
saved as it goes and whole at the end, with the finish the engine reported."""

from __future__ import annotations

import time

import pytest

from chat import live_text, text_stream
from chat.models import Message, Part
from config.redis_client import RedisGate
from inference.engine import EngineEvent, FinishReason
from inference.engine.events import Usage
from tests.support.media import EventTap, new_redis_server
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def streaming_part(conversation) -> Part:
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    part = Part.objects.create(message=reply, index=0, kind="text", state="streaming")
    live_text.reset(part.pk)
    return part


def token(index: int, text: str, **finish) -> EngineEvent:
    return EngineEvent(request_id="fake", index=index, token_id=100 + index, text=text, **finish)


def settled(part: Part, state: str) -> Part:
    wait_until(lambda: Part.objects.get(pk=part.pk).state == state, 10, f"the part to be {state}")
    return Part.objects.get(pk=part.pk)


def contiguous(deltas: list[dict]) -> tuple[str, int]:
    """The text and last seq of deltas whose ranges follow each other without gap or overlap."""
    text, seq = "", 0
    for delta in deltas:
        assert delta["first"] == seq + 1 and delta["seq"] >= delta["first"], (seq, delta)
        text, seq = text + delta["text"], delta["seq"]
    return text, seq


def test_pieces_are_numbered_tailed_broadcast_saved_and_finished(conversation, monkeypatch):
    monkeypatch.setattr(text_stream, "SAVE_INTERVAL", 0.0)  # save after every piece
    part = streaming_part(conversation)
    text_stream.writer.ensure_running()
    feed = text_stream.writer.callback(part, conversation.pk)
    with EventTap(conversation.pk) as tap:
        feed(token(0, "Hel"))
        wait_until(lambda: Part.objects.get(pk=part.pk).text == "Hel", 10, "the first piece saved")
        feed(token(1, ""))  # held back by the detokenizer: no piece, no seq
        feed(token(2, "lo"))
        usage = Usage(prompt_tokens=5, completion_tokens=4)
        done = {"finish_reason": FinishReason.EOS_TOKEN, "usage": usage, "full_text": "Hello!"}
        feed(token(3, "!", is_finished=True, **done))
        final = settled(part, Part.State.SUCCEEDED)
        sent = tap.settle()
    assert (final.text, final.seq, final.finish_reason) == ("Hello!", 3, "eos_token")
    assert (final.prompt_tokens, final.completion_tokens) == (5, 4)
    assert final.first_token_at is not None and final.finished_at is not None
    assert live_text.tail(part.pk, 0) == ["Hel", "lo", "!"]
    deltas = [e for e in sent if e["type"] == "part.delta"]
    assert (deltas[0]["first"], deltas[0]["seq"], deltas[0]["text"]) == (1, 1, "Hel")
    assert contiguous(deltas) == ("Hello!", 3)
    assert all(e["t"] > 0 for e in deltas)
    states = [e["part"]["state"] for e in sent if e["type"] == "part.state"]
    assert states == ["succeeded"]
    complete = {"type": "message.state", "message_id": part.message_id, "status": "complete"}
    assert sent[-1] == complete


def test_pieces_that_queue_up_go_out_together_as_one_range(conversation):
    """While the writer is busy the engine's pieces queue up; they go out as a few deltas with
    seq ranges, not one each, and the ranges join up to the whole text."""
    part = streaming_part(conversation)
    text_stream.writer.ensure_running()
    feed = text_stream.writer.callback(part, conversation.pk)
    pieces = [f" w{n}" for n in range(1, 101)]
    with EventTap(conversation.pk) as tap:
        with text_stream.writer._handling:  # the writer is busy: the pieces wait in its queue
            for index, piece in enumerate(pieces):
                feed(token(index, piece))
            feed(token(100, ".", is_finished=True, finish_reason=FinishReason.LENGTH))
        settled(part, Part.State.SUCCEEDED)
        deltas = [e for e in tap.settle() if e["type"] == "part.delta"]
    assert contiguous(deltas) == ("".join(pieces) + ".", 101)
    assert len(deltas) <= 5, [(d["first"], d["seq"]) for d in deltas]
    assert live_text.tail(part.pk, 0) == [*pieces, "."]


@pytest.mark.parametrize(
    ("reason", "error", "state"),
    [(FinishReason.CANCELLED, None, "cancelled"), (FinishReason.ERROR, "CUDA fell over", "failed")],
)
def test_a_cancel_or_an_error_ends_the_part_with_its_text_kept(conversation, reason, error, state):
    part = streaming_part(conversation)
    text_stream.writer.ensure_running()
    feed = text_stream.writer.callback(part, conversation.pk)
    feed(token(0, "Once upon"))
    feed(EngineEvent("fake", 1, None, "", is_finished=True, finish_reason=reason, error=error))
    final = settled(part, state)
    assert (final.text, final.seq, final.finish_reason) == ("Once upon", 1, reason.value)
    assert final.error == (f"The engine failed while writing this reply: {error}" if error else "")


def test_redis_gate_skips_calls_while_down_and_opens_within_a_second_of_redis_returning(
    service_logs, settings
):
    server = new_redis_server(service_logs).start()
    settings.REDIS_URL = server.url
    gate = RedisGate()
    try:
        assert gate.open()
        server.stop()
        gate.failed()
        started = time.monotonic()
        answers = [gate.open() for _ in range(1000)]
        assert not any(answers) and time.monotonic() - started < 1  # no call waits for Redis
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # callers keep asking; probes back off to 1 s apart
            assert not gate.open()
            time.sleep(0.01)
        server.start()
        back = time.monotonic()
        wait_until(gate.open, 5, "the gate to open", interval=0.01)
        assert time.monotonic() - back <= 1.5
    finally:
        server.stop()


def test_while_redis_is_down_the_text_goes_on_and_the_tail_is_rebuilt_when_it_returns(
    conversation, service_logs, settings, monkeypatch
):
    """Redis restarts empty mid-stream: the writer skips the tail while it is down, then puts
    every piece back, so the tail still numbers delta n as item n; the text is all there."""
    monkeypatch.setattr(text_stream, "SAVE_INTERVAL", 0.0)
    server = new_redis_server(service_logs).start()
    settings.REDIS_URL = server.url  # the live tail's and the events' Redis
    try:
        part = streaming_part(conversation)
        text_stream.writer.ensure_running()
        feed = text_stream.writer.callback(part, conversation.pk)
        feed(token(0, "Once"))
        wait_until(lambda: live_text.tail(part.pk, 0) == ["Once"], 10, "the first piece tailed")
        server.stop()
        pieces = [f" {n}" for n in range(1, 201)]
        for index, piece in enumerate(pieces, 1):
            feed(token(index, piece))
        wait_until(lambda: Part.objects.get(pk=part.pk).seq == 201, 20, "the writer to keep up")
        server.start()
        time.sleep(1.2)  # the writer's gate probes Redis at most a second apart
        done = {"finish_reason": FinishReason.LENGTH}
        feed(token(201, " end", is_finished=True, **done))
        final = settled(part, Part.State.SUCCEEDED)
        assert final.text == "Once" + "".join(pieces) + " end" and final.seq == 202
        assert live_text.tail(part.pk, 0) == ["Once", *pieces, " end"]
    finally:
        server.stop()
