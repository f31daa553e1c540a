"""The outbox (media/outbox.py): image parts whose enqueue met a broker outage are sent again
as soon as the broker answers, once, whoever else (the sweeper) also sends them.

The first tests drive an Outbox with a fake sender and a switch for the broker; the rest stop
and start a private redis-server by pid and read its media queue.
"""

from __future__ import annotations

import threading
import time

import pytest

from chat.models import Part
from media import services
from media.outbox import Outbox
from media.services import image_enqueue, image_send
from tests.media.conftest import make_turn
from tests.support.media import celery_broker, media_queue, new_redis_server
from tests.support.processes import wait_until


class FakeBroker:
    """A sender that answers from a script, and a switch for whether the broker answers."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.calls: list[tuple[int, str]] = []
        self.refuse: set[int] = set()  # parts the broker refuses even while up
        self.taken_elsewhere: set[int] = set()  # parts whose row another sender changed

    def send(self, part_id: int, task_id: str) -> tuple[str, bool]:
        self.calls.append((part_id, task_id))
        if part_id in self.taken_elsewhere:
            return "", False
        return f"{task_id}+", part_id not in self.refuse

    def outbox(self) -> Outbox:
        return Outbox(self.send, self.up.is_set, poll=0.01)


def test_the_outbox_waits_for_the_broker_then_sends_everything_oldest_first():
    broker = FakeBroker()
    outbox = broker.outbox()
    for part_id in range(1, 201):  # many parts queued during the outage
        outbox.hold(part_id, f"t{part_id}")
    time.sleep(0.1)
    assert broker.calls == [] and len(outbox.held()) == 200
    broker.up.set()
    wait_until(lambda: not outbox.held(), 5, "the outbox to empty")
    assert broker.calls == [(n, f"t{n}") for n in range(1, 201)]
    wait_until(lambda: outbox._thread is None, 5, "the outbox thread to end")


def test_a_refused_send_keeps_the_part_and_a_part_sent_elsewhere_is_dropped():
    broker = FakeBroker()
    broker.refuse, broker.taken_elsewhere = {2}, {1}
    outbox = broker.outbox()
    outbox.hold(1, "a")
    outbox.hold(2, "b")
    outbox.hold(3, "c")
    broker.up.set()
    wait_until(lambda: (2, "b+") in broker.calls, 5, "the refused part to be tried again")
    assert set(outbox.held()) == {2, 3}  # 1 was sent by someone else; 3 waits behind 2
    assert (1, "a") in broker.calls and [call for call in broker.calls if call[0] == 3] == []
    broker.refuse.clear()
    wait_until(lambda: not outbox.held(), 5, "the outbox to empty")
    assert [call[0] for call in broker.calls].count(1) == 1


@pytest.fixture
def stopped_broker(service_logs):
    """A private Redis as this process's broker, stopped; the test starts it again."""
    server = new_redis_server(service_logs).start()
    try:
        with celery_broker(server.url):
            server.stop()
            yield server
            wait_until(lambda: not services.outbox.held(), 10, "the outbox to empty")
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_an_image_enqueued_during_an_outage_is_sent_within_a_second_of_the_broker_returning(
    stopped_broker,
):
    turns = [make_turn() for _ in range(5)]
    started = time.monotonic()
    assert [image_enqueue(turn.image) for turn in turns] == [False] * 5
    assert time.monotonic() - started < 5  # the request is not held by the outage
    held = services.outbox.held()
    assert held == {turn.image.pk: turn.refresh().task_id for turn in turns}
    assert {turn.refresh().state for turn in turns} == {Part.State.QUEUED}

    stopped_broker.start()
    back = time.monotonic()
    wait_until(lambda: not services.outbox.held(), 10, "the outbox to send the images")
    sent_after = time.monotonic() - back
    assert sorted(media_queue(stopped_broker.url)) == sorted(t.refresh().task_id for t in turns)
    assert sent_after < 2.0  # POLL is 0.5 s; a ping and five publishes on a busy machine


@pytest.mark.django_db(transaction=True)
def test_the_outbox_does_not_send_again_a_part_the_sweeper_sent_first(stopped_broker, monkeypatch):
    """The sweeper's send replaces the task id the outbox holds, so the outbox drops it; an
    image enqueued while the outbox holds parts joins them without trying the broker."""
    broker_back = threading.Event()
    monkeypatch.setattr(services, "outbox", Outbox(image_send, broker_back.is_set, poll=0.01))
    turn = make_turn()
    assert image_enqueue(turn.image) is False
    [(part_id, held_task)] = services.outbox.held().items()

    stopped_broker.start()
    # The sweeper, in a worker whose outbox is empty, sends the stale part: image_enqueue there.
    swept_task, sent = image_send(part_id, turn.refresh().task_id)
    assert sent and swept_task == turn.refresh().task_id
    later = make_turn()
    started = time.monotonic()
    assert image_enqueue(later.image) is False and time.monotonic() - started < 0.5
    assert services.outbox.held() == {part_id: held_task, later.image.pk: ""}
    broker_back.set()
    wait_until(lambda: not services.outbox.held(), 5, "the outbox to drop the part")
    assert turn.refresh().task_id == swept_task != held_task
    assert sorted(media_queue(stopped_broker.url)) == sorted([swept_task, later.refresh().task_id])
