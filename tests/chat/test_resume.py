"""The resume protocol (chat/resume.py), once for both transports, on a real Daphne.

A reply is mid-stream: part of its text saved, the rest only in the live tail. A client
connects over the WebSocket or over SSE, then live events arrive, some of them already shown
(a delta inside the snapshot, a delta behind a part state). Both transports must show the
same thing: the snapshot with the whole text so far, then only what is new, to the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psutil
import pytest
from django.contrib.auth import get_user_model
from websockets.sync.client import connect

from chat import events, live_text
from chat.models import Conversation, Message, Part
from chat.parts import part_transition
from tests.chat.test_sse import read_events, signed_in
from tests.conftest import Daphne, daphne_without_model

pytestmark = pytest.mark.django_db(transaction=True)

Shown = tuple[str, dict]


@pytest.fixture(scope="module")
def server(django_db_setup, service_logs) -> Iterator[Daphne]:
    """A Daphne without the model: the protocol needs none, and loading it costs CPU."""
    with daphne_without_model("daphne-resume", service_logs) as daphne:
        yield daphne


def streaming_reply(owner) -> Part:
    """ "Hello" saved at seq 2; " wor" and "ld" (seq 3 and 4) only in the live tail."""
    conversation = Conversation.objects.create(owner=owner)
    Message.objects.create(conversation=conversation, role="user", position=0, text="Hi")
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    part = Part.objects.create(
        message=reply, index=0, kind="text", state="streaming", text="Hello", seq=2
    )
    live_text.reset(part.pk)
    for piece in ["He", "llo", " wor", "ld"]:
        live_text.append(part.pk, piece)
    return part


def send_live_events(part: Part) -> None:
    """What the stream sends after the client joined: two stale deltas among new events."""
    conversation_id = part.message.conversation_id
    events.send(conversation_id, events.delta_event(part.pk, part.message_id, 4, "ld"))
    part.text, part.seq = "Hello world!!", 6
    events.send(conversation_id, events.part_state_event(part))
    events.send(conversation_id, events.delta_event(part.pk, part.message_id, 5, "!"))
    events.send(conversation_id, events.delta_event(part.pk, part.message_id, 7, "?"))
    part_transition(part.pk, Part.State.SUCCEEDED, text="Hello world!!?", seq=7)


def shown(kind: str, data: dict) -> Shown:
    """The part of an event that the protocol decides, the same for both transports."""
    if kind == "part.state":
        return kind, {key: data[key] for key in ("id", "state", "seq", "text")}
    if kind == "part.delta":
        return kind, {key: data[key] for key in ("part_id", "first", "seq", "text")}
    return kind, {"message_id": data["message_id"], "status": data["status"]}


def over_websocket(server: Daphne, session, part: Part, send=send_live_events) -> list[Shown]:
    """The socket's snapshot as the part and message states it holds, then the live events."""
    url = f"{server.ws_url}/ws/conversations/{part.message.conversation_id}/"
    headers = {"Cookie": f"sessionid={session.cookies['sessionid']}", "Origin": server.url}
    seen: list[Shown] = []
    with connect(url, additional_headers=headers, open_timeout=10) as ws:
        snapshot = json.loads(ws.recv(timeout=10))
        [reply] = [m for m in snapshot["messages"] if m["id"] == part.message_id]
        seen += [shown("part.state", p) for p in reply["parts"]]
        seen.append(shown("message.state", {"message_id": reply["id"], **reply}))
        send(part)
        while seen[-1] != shown("message.state", {"message_id": reply["id"], "status": "complete"}):
            event = json.loads(ws.recv(timeout=10))
            data = event["part"] if event["type"] == "part.state" else event
            seen.append(shown(event["type"], data))
    return seen


def over_sse(server: Daphne, session, part: Part, send=send_live_events) -> list[Shown]:
    """The stream's frames; its headers come once it joined, so the events can go then."""
    url = f"{server.url}/m/{part.message_id}/events"
    seen: list[Shown] = []
    with session.get(url, stream=True, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache"
        send(part)
        for event in read_events(response):
            if event["event"] == "part.delta":
                assert event["id"] == event["data"]["seq"]
            seen.append(shown(event["event"], event["data"]))
    return seen


@pytest.mark.parametrize("transport", [over_websocket, over_sse], ids=["ws", "sse"])
def test_snapshot_then_only_new_events_on_both_transports(server, transport):
    session = signed_in(server, f"resume-{transport.__name__}")
    part = streaming_reply(get_user_model().objects.get(username=f"resume-{transport.__name__}"))
    text, message = part.pk, part.message_id
    assert transport(server, session, part) == [
        ("part.state", {"id": text, "state": "streaming", "seq": 4, "text": "Hello world"}),
        ("message.state", {"message_id": message, "status": "in_progress"}),
        ("part.state", {"id": text, "state": "streaming", "seq": 6, "text": "Hello world!!"}),
        ("part.delta", {"part_id": text, "first": 7, "seq": 7, "text": "?"}),
        ("part.state", {"id": text, "state": "succeeded", "seq": 7, "text": "Hello world!!?"}),
        ("message.state", {"message_id": message, "status": "complete"}),
    ]


def send_with_a_gap(part: Part) -> None:
    """Pieces 5 and 6 reach the live tail, but only the delta of 6 is sent: 5's is lost."""
    conversation_id = part.message.conversation_id
    live_text.append(part.pk, "!", "?")
    events.send(conversation_id, events.delta_event(part.pk, part.message_id, 6, "?"))
    part_transition(part.pk, Part.State.SUCCEEDED, text="Hello world!?", seq=6)


@pytest.mark.parametrize("transport", [over_websocket, over_sse], ids=["ws", "sse"])
def test_a_forced_gap_is_mended_on_both_transports(server, transport):
    """The reader mends the gap from the live tail: one delta of 5..6, then the end."""
    username = f"gap-{transport.__name__}"
    session = signed_in(server, username)
    part = streaming_reply(get_user_model().objects.get(username=username))
    text, message = part.pk, part.message_id
    assert transport(server, session, part, send_with_a_gap) == [
        ("part.state", {"id": text, "state": "streaming", "seq": 4, "text": "Hello world"}),
        ("message.state", {"message_id": message, "status": "in_progress"}),
        ("part.delta", {"part_id": text, "first": 5, "seq": 6, "text": "!?"}),
        ("part.state", {"id": text, "state": "succeeded", "seq": 6, "text": "Hello world!?"}),
        ("message.state", {"message_id": message, "status": "complete"}),
    ]


def test_sse_streams_hold_no_thread_each(server):
    """Twenty open SSE streams of one reply: Daphne's threads stay about as many as before
    (the view once held a thread-sensitive executor, one OS thread, per stream)."""
    session = signed_in(server, "sse-threads")
    part = streaming_reply(get_user_model().objects.get(username="sse-threads"))
    daphne = psutil.Process(server.service.pid)
    url = f"{server.url}/m/{part.message_id}/events"
    before = daphne.num_threads()
    streams = [session.get(url, stream=True, timeout=30) for _ in range(20)]
    try:
        assert all(stream.status_code == 200 for stream in streams)
        held = daphne.num_threads()
    finally:
        for stream in streams:
            stream.close()
    assert held - before < 5, (before, held)


def test_sse_reconnect_ahead_of_the_snapshot_repeats_nothing(server):
    """The client has seq 5 (its delta was published before the live tail held it); the
    snapshot says 4. The next live delta spans 5..6: only 6 may reach the client."""
    session = signed_in(server, "resume-ahead")
    part = streaming_reply(get_user_model().objects.get(username="resume-ahead"))
    url = f"{server.url}/m/{part.message_id}/events"
    seen: list[Shown] = []
    with session.get(url, stream=True, timeout=30, headers={"Last-Event-ID": "5"}) as response:
        live_text.append(part.pk, "!", "?")
        conversation_id = part.message.conversation_id
        events.send(conversation_id, events.delta_event(part.pk, part.message_id, 6, "!?", first=5))
        part_transition(part.pk, Part.State.SUCCEEDED, text="Hello world!?", seq=6)
        for event in read_events(response):
            seen.append(shown(event["event"], event["data"]))
    deltas = [data for kind, data in seen if kind == "part.delta"]
    assert deltas == [{"part_id": part.pk, "first": 6, "seq": 6, "text": "?"}]
