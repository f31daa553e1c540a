"""The text writer with many parts at once (chat/text_stream.py): their saves go out as one
batched statement per interval, their pieces in one Redis pipeline per flush. Real database
and Redis; the one fault no test can cause for real (the database refusing one row's save
while it takes the others') is injected.

Every part's saved text stays exact: with a part deleted in the middle of a flush, and with
one part's saves failing while the others' go through (it catches up once they work)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, OperationalError

from chat import kept_connections, live_text, text_stream
from chat.models import Conversation, Message, Part
from inference.engine import EngineEvent, FinishReason
from tests.support.media import EventTap
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PARTS = 12
PIECES = 40


def streaming_parts(owner, count: int) -> list[tuple[Part, int]]:
    """`count` streaming text parts, each in a conversation of its own."""
    made = []
    for index in range(count):
        conversation = Conversation.objects.create(owner=owner, title=f"batch {index}")
        reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
        part = Part.objects.create(message=reply, index=0, kind="text", state="streaming")
        live_text.reset(part.pk)
        made.append((part, conversation.pk))
    return made


def piece(part_number: int, index: int) -> str:
    return f" p{part_number}w{index}"


def token(index: int, text: str, **finish) -> EngineEvent:
    return EngineEvent(request_id="fake", index=index, token_id=100 + index, text=text, **finish)


def feed_interleaved(feeds, start: int, stop: int) -> None:
    """Pieces start..stop-1 of every part, one part after another per index, as an engine
    step emits them."""
    for index in range(start, stop):
        for number, feed in enumerate(feeds):
            feed(token(index, piece(number, index)))


def finish_all(feeds) -> None:
    for feed in feeds:
        feed(token(PIECES, "", is_finished=True, finish_reason=FinishReason.LENGTH))


def expected(number: int) -> str:
    return "".join(piece(number, index) for index in range(PIECES))


def settled(parts) -> dict[int, Part]:
    ids = [part.pk for part, _ in parts]
    wait_until(
        lambda: Part.objects.filter(pk__in=ids).exclude(state="succeeded").count() == 0,
        20,
        "every part to end",
    )
    return Part.objects.in_bulk(ids)


@pytest.fixture
def batches(monkeypatch):
    """The batches the writer saved (part ids of each), through the real batched save."""
    seen: list[list[int]] = []
    real = text_stream.parts_update

    def recording(changes, **options):
        seen.append([part.pk for part, _ in changes])
        return real(changes, **options)

    monkeypatch.setattr(text_stream, "parts_update", recording)
    monkeypatch.setattr(text_stream, "SAVE_INTERVAL", 0.05)
    return seen


def test_many_parts_are_saved_together_and_every_reader_sees_every_piece_once(alice, batches):
    parts = streaming_parts(alice, PARTS)
    text_stream.writer.ensure_running()
    feeds = [text_stream.writer.callback(part, conversation) for part, conversation in parts]
    taps = [EventTap(conversation) for _, conversation in parts]
    for tap in taps:
        tap.__enter__()
    try:
        with text_stream.writer._handling:  # the writer is busy: the pieces queue up
            feed_interleaved(feeds, 0, PIECES // 2)
        wait_until(lambda: any(len(batch) > 1 for batch in batches), 10, "a batched save")
        feed_interleaved(feeds, PIECES // 2, PIECES)
        finish_all(feeds)
        saved = settled(parts)
        sent = [tap.settle() for tap in taps]
    finally:
        for tap in taps:
            tap.__exit__(None, None, None)
    for number, ((part, _), events) in enumerate(zip(parts, sent, strict=True)):
        deltas = [e for e in events if e["type"] == "part.delta" and e["part_id"] == part.pk]
        seqs = [seq for d in deltas for seq in range(d["first"], d["seq"] + 1)]
        assert seqs == list(range(1, PIECES + 1)), (part.pk, seqs)  # each piece once, in order
        assert "".join(d["text"] for d in deltas) == expected(number)
        assert (saved[part.pk].text, saved[part.pk].seq) == (expected(number), PIECES)
        assert live_text.tail(part.pk, 0) == [piece(number, i) for i in range(PIECES)]
    assert max(len(batch) for batch in batches) > 1, batches


def test_a_part_deleted_mid_flush_leaves_the_others_saved_exactly(alice, batches):
    parts = streaming_parts(alice, 4)
    doomed, _ = parts[1]
    text_stream.writer.ensure_running()
    feeds = [text_stream.writer.callback(part, conversation) for part, conversation in parts]
    with text_stream.writer._handling:  # its pieces are queued when the row goes
        feed_interleaved(feeds, 0, PIECES // 2)
        Part.objects.filter(pk=doomed.pk).delete()
    wait_until(lambda: any(doomed.pk in batch for batch in batches), 10, "a save with it")
    feed_interleaved(feeds, PIECES // 2, PIECES)
    finish_all(feeds)
    kept = [entry for entry in parts if entry[0].pk != doomed.pk]
    saved = settled(kept)
    for number, (part, _) in enumerate(parts):
        if part.pk != doomed.pk:
            assert (saved[part.pk].text, saved[part.pk].seq) == (expected(number), PIECES)
    assert not Part.objects.filter(pk=doomed.pk).exists()


def test_a_save_failing_for_one_part_holds_back_only_that_part(alice, batches, monkeypatch):
    parts = streaming_parts(alice, 4)
    refused, _ = parts[2]
    faulty = {"on": True}
    real_one = text_stream.part_update
    real_batch = text_stream.parts_update

    def batch(changes, **options):
        if faulty["on"] and any(part.pk == refused.pk for part, _ in changes):
            raise DatabaseError(f"row {refused.pk} is locked")
        return real_batch(changes, **options)

    def one(part, **fields):
        if faulty["on"] and part.pk == refused.pk:
            raise DatabaseError(f"row {refused.pk} is locked")
        return real_one(part, **fields)

    monkeypatch.setattr(text_stream, "parts_update", batch)
    monkeypatch.setattr(text_stream, "part_update", one)
    text_stream.writer.ensure_running()
    feeds = [text_stream.writer.callback(part, conversation) for part, conversation in parts]
    feed_interleaved(feeds, 0, PIECES // 2)
    others = [part.pk for part, _ in parts if part.pk != refused.pk]
    wait_until(
        lambda: Part.objects.filter(pk__in=others, seq=PIECES // 2).count() == len(others),
        10,
        "the other parts saved while one is refused",
    )
    assert Part.objects.get(pk=refused.pk).seq == 0  # held back, its text kept by the writer
    faulty["on"] = False
    wait_until(
        lambda: Part.objects.get(pk=refused.pk).seq == PIECES // 2, 10, "the refused part saved"
    )
    half = "".join(piece(2, index) for index in range(PIECES // 2))
    assert Part.objects.get(pk=refused.pk).text == half
    feed_interleaved(feeds, PIECES // 2, PIECES)
    finish_all(feeds)
    saved = settled(parts)
    for number, (part, _) in enumerate(parts):
        assert (saved[part.pk].text, saved[part.pk].seq) == (expected(number), PIECES)
        assert saved[part.pk].first_token_at is not None


def test_a_batch_split_by_the_parameter_limit_saves_each_part_its_own_fields(alice, monkeypatch):
    """SQLite allows 999 parameters a statement, so a big batch is cut in pieces; a piece in
    which no part carries a field (only one part has its first token time) leaves it alone."""
    from django.db import connection
    from django.utils import timezone

    from chat.parts import parts_update

    parts = [part for part, _ in streaming_parts(alice, 5)]
    monkeypatch.setattr(connection.features, "max_query_params", 12)  # two parts a statement
    first = timezone.now()
    changes = [(part, {"text": f"text {n}", "seq": n + 1}) for n, part in enumerate(parts)]
    changes[0][1]["first_token_at"] = first
    assert parts_update(changes, streaming_only=True) == len(parts)
    saved = Part.objects.in_bulk([part.pk for part in parts])
    for n, part in enumerate(parts):
        assert (saved[part.pk].text, saved[part.pk].seq) == (f"text {n}", n + 1)
        assert saved[part.pk].first_token_at == (first if n == 0 else None)


def test_the_writer_outlives_a_failure_to_let_its_connection_go(alice, monkeypatch, caplog):
    """Going idle, the writer and its saver let their connections go; when that raised (a
    database gone away; a test without database access) it once ended the writer's thread,
    and every reply's text in the process with it. The fault is injected: the threads are
    the process's own."""

    def unreachable() -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(text_stream, "IDLE_CLOSE", 0.05)
    monkeypatch.setattr(kept_connections, "close_old_connections", unreachable)
    text_stream.writer.ensure_running()
    wait_until(
        lambda: "could not let a kept database connection go" in caplog.text,
        5,
        "an idle close to fail",
    )
    monkeypatch.undo()
    parts = streaming_parts(alice, 2)
    feeds = [text_stream.writer.callback(part, conversation) for part, conversation in parts]
    feed_interleaved(feeds, 0, PIECES)
    finish_all(feeds)
    saved = settled(parts)
    for number, (part, _) in enumerate(parts):
        assert (saved[part.pk].text, saved[part.pk].seq) == (expected(number), PIECES)
