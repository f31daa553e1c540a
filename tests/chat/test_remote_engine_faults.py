"""Faults between a web process and its remote engine, caused for real on processes the tests
start: a full engine (429), a web process that dies mid-stream, an engine that stalls
(SIGSTOP) and one that dies (SIGKILL).

The engine box decodes one reply at a time and lets one wait, slowly (synthetic tokens at
20/s), so every state is easy to catch.
"""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat import heartbeat
from chat.models import Conversation, Part
from inference.provisioning.remote_engine import BUSY
from media.sweeper import interrupt_orphaned_text
from tests.chat.test_remote_engine import running_requests
from tests.chat.test_sse import post_turn, read_events, signed_in
from tests.conftest import serving, start_daphne, wait_for_model
from tests.support.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]

STALL = 2


@pytest.fixture(scope="module")
def slow_box(django_db_setup, service_logs):
    with serving(
        "engine-box-slow",
        service_logs,
        TANDEM_ROLE="engine",
        TANDEM_ENGINE_SOURCE="synthetic",
        TANDEM_SYNTHETIC_TOKENS_PER_S="20",
        TANDEM_MAX_RUNNING="1",
        TANDEM_MAX_WAITING="1",
        timeout=120,
    ) as server:
        yield server


def web_env(box) -> dict[str, str]:
    return {
        "TANDEM_ENGINE": box.url,
        "TANDEM_ENGINE_STALL_TIMEOUT": str(STALL),
        "TANDEM_HEARTBEAT_TTL": "2",
    }


@pytest.fixture(scope="module")
def web(slow_box, service_logs):
    with serving("web-slow-box", service_logs, **web_env(slow_box)) as server:
        yield server


def start_reply(server, session, user, deltas: int = 3) -> int:
    """Post a long turn and read until `deltas` pieces arrived; the reply's id."""
    conversation = Conversation.objects.create(owner=user, max_new_tokens=1000)
    created = post_turn(server, session, conversation.pk, "Keep going.")
    assert created.status_code == 201, created.text
    reply_id = created.json()["reply"]["id"]
    if deltas:
        url = f"{server.url}/m/{reply_id}/events"
        with session.get(url, stream=True, timeout=60) as response:
            for _ in read_events(response, stop_after_deltas=deltas):
                pass
    return reply_id


def text_part(reply_id: int) -> Part:
    return Part.objects.get(message_id=reply_id, kind="text")


def final(reply_id: int, timeout: float = 20) -> Part:
    wait_until(
        lambda: text_part(reply_id).state not in (Part.State.QUEUED, Part.State.STREAMING),
        timeout,
        "the text part to end",
    )
    return text_part(reply_id)


def stop(server, session, reply_id: int) -> None:
    session.post(
        f"{server.url}/m/{reply_id}/stop",
        headers={"X-CSRFToken": session.cookies["csrftoken"], "Referer": server.url},
        timeout=30,
    )


def test_a_full_engine_fails_the_part_with_the_busy_notice(slow_box, web):
    session = signed_in(web, "busy-user")
    user = get_user_model().objects.get(username="busy-user")
    running = start_reply(web, session, user)
    waiting = start_reply(web, session, user, deltas=0)
    wait_until(lambda: running_requests(slow_box, "waiting") == 1, 15, "the second to wait")
    refused = start_reply(web, session, user, deltas=0)
    part = final(refused)
    assert part.state == Part.State.FAILED
    assert BUSY in part.error and "429" in part.error, part.error
    for reply_id in (running, waiting):
        stop(web, session, reply_id)
        assert final(reply_id).state == Part.State.CANCELLED
    wait_until(lambda: running_requests(slow_box) == 0, 15, "the engine to be idle")


def test_a_dead_web_process_leaves_its_part_to_the_sweeper(slow_box, service_logs):
    doomed = start_daphne("web-doomed", service_logs, **web_env(slow_box))
    try:
        wait_for_model(doomed)
        session = signed_in(doomed, "doomed-user")
        user = get_user_model().objects.get(username="doomed-user")
        reply_id = start_reply(doomed, session, user, deltas=4)
        owner = text_part(reply_id).stream_owner
        doomed.service.kill(signal.SIGKILL)
    finally:
        doomed.service.stop()
    wait_until(lambda: running_requests(slow_box) == 0, 15, "the engine to drop the request")
    wait_until(lambda: not heartbeat.is_alive(owner), 10, "the heartbeat to expire")
    interrupt_orphaned_text(timezone.now() + timedelta(minutes=5))
    part = text_part(reply_id)
    assert part.state == Part.State.INTERRUPTED and part.seq >= 4 and part.text


def test_a_stalled_or_dropped_stream_is_interrupted_with_its_text_kept(slow_box, web):
    session = signed_in(web, "stall-user")
    user = get_user_model().objects.get(username="stall-user")
    stalled = start_reply(web, session, user)
    slow_box.service.kill(signal.SIGSTOP)
    try:
        part = final(stalled, timeout=STALL + 15)
    finally:
        slow_box.service.kill(signal.SIGCONT)
    assert part.state == Part.State.INTERRUPTED and part.seq >= 3 and part.text
    assert f"sent nothing for {STALL} s" in part.error
    wait_until(lambda: running_requests(slow_box) == 0, 15, "the engine to drop the request")

    dropped = start_reply(web, session, user)
    slow_box.service.kill(signal.SIGKILL)
    part = final(dropped)
    assert part.state == Part.State.INTERRUPTED and part.seq >= 3 and part.text
    assert "dropped" in part.error or "ended before the reply did" in part.error, part.error
