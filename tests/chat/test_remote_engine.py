"""A web Daphne whose text comes from another Daphne (TANDEM_ENGINE=<url>): an engine-only
Tandem (TANDEM_ROLE=engine) with synthetic tokens, so the text is known and cheap.

The reply streams over SSE with the same events and text as a web process with its own engine;
Stop closes the upstream stream and the engine's running count drops (from the process that
streams it or from another one); an unreachable engine fails the part with the reason; a
conversation whose engine is down goes to the next replica; the engine role serves no chat.
"""

from __future__ import annotations

import re
import urllib.request

import pytest
import requests
from django.contrib.auth import get_user_model

from chat.models import Conversation, Part
from inference.provisioning import synthetic
from tests.chat.test_sse import logged_in, post_turn, read_events, signed_in
from tests.conftest import serving
from tests.support.processes import free_port, wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]

KEY = "engine-box-key"
NEW_TOKENS = "24"
WEB = {"TANDEM_CHAT_MAX_NEW_TOKENS": NEW_TOKENS, "TANDEM_ENGINE_API_KEY": KEY}


@pytest.fixture(scope="module")
def engine_box(django_db_setup, service_logs):
    with serving(
        "engine-box",
        service_logs,
        TANDEM_ROLE="engine",
        TANDEM_ENGINE_SOURCE="synthetic",
        TANDEM_SYNTHETIC_TOKENS_PER_S="100",
        TANDEM_API_KEYS=KEY,
        timeout=120,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def remote_web(engine_box, service_logs):
    with serving("web-remote", service_logs, TANDEM_ENGINE=engine_box.url, **WEB) as server:
        yield server


@pytest.fixture(scope="module")
def failover_web(engine_box, service_logs):
    """A second web process: its first replica is a port nothing listens on."""
    dead = f"http://127.0.0.1:{free_port()}"
    engines = f"{dead},{engine_box.url}"
    with serving("web-failover", service_logs, TANDEM_ENGINE=engines, **WEB) as server:
        server.dead_url = dead
        yield server


def streamed_reply(server, username: str, **conversation_fields):
    """Sign in, post a turn, read its events to the end: (events, the text part)."""
    session = signed_in(server, username)
    user = get_user_model().objects.get(username=username)
    conversation = Conversation.objects.create(owner=user, **conversation_fields)
    created = post_turn(server, session, conversation.pk, "Tell me about streams.")
    assert created.status_code == 201, created.text
    reply_id = created.json()["reply"]["id"]
    with session.get(f"{server.url}/m/{reply_id}/events", stream=True, timeout=60) as response:
        events = list(read_events(response))
    return events, Part.objects.get(message_id=reply_id, kind="text")


def shown_text(events) -> str:
    """The text part as a page builds it: the snapshot's text, then each next delta in order
    (a delta may carry several pieces, `first`..`seq`, when they came within one window)."""
    text, seq = "", 0
    for event in events:
        data = event["data"]
        if event["event"] == "part.state" and data["kind"] == "text" and data["seq"] >= seq:
            text, seq = data["text"], data["seq"]
        elif event["event"] == "part.delta":
            assert data["first"] == seq + 1 and data["seq"] >= data["first"], "a gap or a repeat"
            text, seq = text + data["text"], data["seq"]
    return text


def running_requests(engine_box, gauge: str = "running") -> float:
    """The engine box's gauge of requests decoding (or `waiting`) now, from its /metrics."""
    with urllib.request.urlopen(f"{engine_box.url}/metrics", timeout=10) as response:
        body = response.read().decode()
    line = rf"^tandem_engine_{gauge}_requests (\S+)$"
    return float(re.search(line, body, re.M).group(1))


def test_a_reply_streams_from_the_engine_box_as_from_a_local_engine(
    engine_box, remote_web, service_logs
):
    events, part = streamed_reply(remote_web, "remote-user")
    assert shown_text(events) == part.text
    assert part.state == Part.State.SUCCEEDED
    assert part.completion_tokens == int(NEW_TOKENS) and part.prompt_tokens > 0
    assert part.first_token_at is not None and part.seq >= 1
    assert part.text.strip() and part.text.strip() in synthetic.TEXT * 2

    with serving(
        "web-local-synthetic",
        service_logs,
        TANDEM_ENGINE_SOURCE="synthetic",
        TANDEM_SYNTHETIC_TOKENS_PER_S="100",
        timeout=120,
        **WEB,
    ) as local_web:
        local_events, local_part = streamed_reply(local_web, "local-user")

    def shape(stream):
        kinds = [e["event"] for e in stream if e["event"] != "part.delta"]
        return sorted(set(kinds)), any(e["event"] == "part.delta" for e in stream)

    assert shape(events) == shape(local_events)
    assert shown_text(local_events) == local_part.text
    assert part.text == local_part.text  # the same prompt ids: the engine box templates alike
    assert part.finish_reason == local_part.finish_reason
    health = requests.get(f"{remote_web.url}/health", timeout=10).json()
    assert health["model"]["state"] == "remote"
    [engine] = health["model"]["engines"]
    assert engine["url"] == engine_box.url and engine["reachable"]
    assert engine["latency_ms"] is not None


def stop_midway(engine_box, streaming_server, stopping_server, username: str) -> Part:
    """Start a long reply on one web process, press Stop on another (or the same) one."""
    session = signed_in(streaming_server, username)  # its cookies hold on either port
    user = get_user_model().objects.get(username=username)
    conversation = Conversation.objects.create(owner=user, max_new_tokens=1000)
    created = post_turn(streaming_server, session, conversation.pk, "Go on and on.")
    reply_id = created.json()["reply"]["id"]
    url = f"{streaming_server.url}/m/{reply_id}/events"
    with session.get(url, stream=True, timeout=60) as response:
        for _ in read_events(response, stop_after_deltas=5):
            pass
    assert running_requests(engine_box) == 1
    stopped = session.post(
        f"{stopping_server.url}/m/{reply_id}/stop",
        headers={"X-CSRFToken": session.cookies["csrftoken"], "Referer": stopping_server.url},
        timeout=30,
    )
    assert stopped.status_code < 300, stopped.text
    part = Part.objects.get(message_id=reply_id, kind="text")
    wait_until(lambda: running_requests(engine_box) == 0, 15, "the engine to drop the request")
    wait_until(lambda: Part.objects.get(pk=part.pk).state == Part.State.CANCELLED, 15, "cancelled")
    part.refresh_from_db()
    assert 5 <= part.seq < 1000 and part.text
    return part


def test_stop_cancels_the_request_on_the_engine_box(engine_box, remote_web):
    stop_midway(engine_box, remote_web, remote_web, "stopper")


def test_stop_from_another_web_process_reaches_the_streaming_one(
    engine_box, remote_web, failover_web
):
    stop_midway(engine_box, remote_web, failover_web, "far-stopper")


def test_a_down_replica_passes_the_conversation_to_the_next(engine_box, failover_web):
    user = get_user_model().objects.create_user("failover", password="failover-pass")
    while (conversation := Conversation.objects.create(owner=user)).pk % 2:
        pass  # an even id starts at the first replica: the dead one
    session = logged_in(failover_web, "failover")
    created = post_turn(failover_web, session, conversation.pk, "Anyone there?")
    reply_id = created.json()["reply"]["id"]
    with session.get(f"{failover_web.url}/m/{reply_id}/events", stream=True, timeout=60) as r:
        list(read_events(r))
    part = Part.objects.get(message_id=reply_id, kind="text")
    assert part.state == Part.State.SUCCEEDED and part.completion_tokens == int(NEW_TOKENS)
    engines = requests.get(f"{failover_web.url}/health", timeout=10).json()["model"]["engines"]
    assert [(e["url"], e["reachable"]) for e in engines] == [
        (failover_web.dead_url, False),
        (engine_box.url, True),
    ]
    assert "ConnectError" in engines[0]["last_error"]


def test_an_unreachable_engine_fails_the_part_with_the_reason(service_logs):
    dead = f"http://127.0.0.1:{free_port()}"
    with serving("web-unreachable", service_logs, TANDEM_ENGINE=dead, **WEB) as server:
        events, part = streamed_reply(server, "unlucky")
        health = requests.get(f"{server.url}/health", timeout=10)
    assert part.state == Part.State.FAILED
    assert "no engine could take this reply" in part.error and dead in part.error
    assert "ConnectError" in part.error
    states = [e["data"] for e in events if e["event"] == "part.state"]
    assert states[-1]["state"] == "failed" and states[-1]["error"] == part.error
    assert health.status_code == 200  # the pages still work; the engine's state says why
    [engine] = health.json()["model"]["engines"]
    assert engine["reachable"] is False and engine["last_error"]


def test_the_engine_role_serves_the_engine_and_no_chat(engine_box):
    for path in ("/", "/c/new", "/accounts/login/", "/admin/", "/ops/", "/c/1/"):
        assert requests.get(f"{engine_box.url}{path}", timeout=10).status_code == 404, path
    assert requests.get(f"{engine_box.url}/health", timeout=10).status_code == 200
    assert requests.get(f"{engine_box.url}/metrics", timeout=10).status_code == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    models = requests.get(f"{engine_box.url}/v1/models", headers=auth, timeout=10)
    assert models.status_code == 200 and models.json()["data"]
    generated = requests.post(
        f"{engine_box.url}/generate",
        json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}},
        headers=auth,
        timeout=30,
    )
    assert generated.status_code == 200 and generated.json()["generated_text"]
