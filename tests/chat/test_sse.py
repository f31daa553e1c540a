"""The per-message SSE stream on a real Daphne, including a reconnect in mid-stream."""

import json

import pytest
import requests
from django.contrib.auth import get_user_model

from chat.models import Conversation, Part

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


def signed_in(server, username: str) -> requests.Session:
    """A browser-like session of a new user: logged in through the form, with its CSRF cookie."""
    get_user_model().objects.create_user(username, password=f"{username}-pass")
    return logged_in(server, username)


def logged_in(server, username: str) -> requests.Session:
    """A browser-like session of a user already made (password `<username>-pass`)."""
    session = requests.Session()
    session.get(f"{server.url}/accounts/login/", timeout=30)
    response = session.post(
        f"{server.url}/accounts/login/",
        data={
            "username": username,
            "password": f"{username}-pass",
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": f"{server.url}/accounts/login/"},
        timeout=30,
    )
    assert response.ok and "sessionid" in session.cookies
    return session


def post_turn(server, session, conversation_id: int, text: str):
    return session.post(
        f"{server.url}/c/{conversation_id}/turns",
        json={"text": text, "image": False},
        headers={"X-CSRFToken": session.cookies["csrftoken"], "Referer": server.url},
        timeout=30,
    )


def read_events(response, stop_after_deltas: int | None = None):
    """Parse SSE frames until the message is final (or enough deltas were read)."""
    event, event_id, deltas = {}, None, 0
    for raw in response.iter_lines(decode_unicode=True):
        if raw.startswith("id: "):
            event_id = int(raw[4:])
        elif raw.startswith("event: "):
            event["event"] = raw[7:]
        elif raw.startswith("data: "):
            event["data"] = json.loads(raw[6:])
        elif raw == "" and event:
            event["id"] = event_id
            yield event
            if event["event"] == "part.delta":
                deltas += 1
                if stop_after_deltas is not None and deltas >= stop_after_deltas:
                    return
            if event["event"] == "message.state" and event["data"]["status"] != "in_progress":
                return
            event, event_id = {}, None


def test_reconnect_mid_stream_loses_and_repeats_nothing(engine_server):
    session = signed_in(engine_server, "sse-user")
    conversation = Conversation.objects.create(
        owner=get_user_model().objects.get(username="sse-user")
    )
    created = post_turn(engine_server, session, conversation.pk, "Describe the ocean in detail.")
    assert created.status_code == 201, created.text
    reply_id = created.json()["reply"]["id"]
    url = f"{engine_server.url}/m/{reply_id}/events"

    text, last_seq = "", 0
    with session.get(url, stream=True, timeout=120) as first:
        assert first.headers["Content-Type"].startswith("text/event-stream")
        for event in read_events(first, stop_after_deltas=4):
            if event["event"] == "part.state" and event["data"]["kind"] == "text":
                text, last_seq = event["data"]["text"], event["data"]["seq"]
            elif event["event"] == "part.delta":
                assert event["id"] == event["data"]["seq"]
                assert event["data"]["first"] == last_seq + 1
                text, last_seq = text + event["data"]["text"], event["id"]

    final_state = None
    with session.get(
        url, stream=True, timeout=180, headers={"Last-Event-ID": str(last_seq)}
    ) as second:
        for event in read_events(second):
            if event["event"] == "part.delta":
                assert event["data"]["first"] == last_seq + 1, "a gap or a repeat on reconnecting"
                text, last_seq = text + event["data"]["text"], event["id"]
            elif event["event"] == "part.state" and event["data"]["kind"] == "text":
                final_state = event["data"]

    part = Part.objects.get(message_id=reply_id, kind="text")
    assert part.state == Part.State.SUCCEEDED or part.state == "succeeded"
    assert final_state["state"] == "succeeded"
    assert text == part.text == final_state["text"]
    assert last_seq == part.seq


def test_other_users_get_404_everywhere(engine_server):
    owner = signed_in(engine_server, "owner-user")
    intruder = signed_in(engine_server, "intruder-user")
    conversation = Conversation.objects.create(
        owner=get_user_model().objects.get(username="owner-user")
    )
    created = post_turn(engine_server, owner, conversation.pk, "Say hi.")
    reply_id = created.json()["reply"]["id"]
    assert intruder.get(f"{engine_server.url}/c/{conversation.pk}/", timeout=30).status_code == 404
    assert intruder.get(f"{engine_server.url}/m/{reply_id}/events", timeout=30).status_code == 404
    refused = post_turn(engine_server, intruder, conversation.pk, "Let me in")
    assert refused.status_code == 404
    stop = intruder.post(
        f"{engine_server.url}/m/{reply_id}/stop",
        headers={"X-CSRFToken": intruder.cookies["csrftoken"], "Referer": engine_server.url},
        timeout=30,
    )
    assert stop.status_code == 404
    with owner.get(f"{engine_server.url}/m/{reply_id}/events", stream=True, timeout=120) as mine:
        assert mine.status_code == 200
        list(read_events(mine))


def test_turn_without_csrf_token_is_refused(engine_server):
    session = signed_in(engine_server, "csrf-user")
    conversation = Conversation.objects.create(
        owner=get_user_model().objects.get(username="csrf-user")
    )
    response = session.post(
        f"{engine_server.url}/c/{conversation.pk}/turns", json={"text": "hi"}, timeout=30
    )
    assert response.status_code == 403
