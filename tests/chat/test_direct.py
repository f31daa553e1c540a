"""Frames written once per event and process (chat/direct.py), on a real Daphne.

The resume tests (test_resume.py) run the direct path for small events, mends and skips;
these cover frame sizes past each length encoding, the close after a deletion, and that
Daphne's `send` is the one recognised (or every socket would silently take the slow path).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chat import events, live_text
from chat.consumers import NOT_FOUND
from chat.direct import daphne_protocol, text_frame
from chat.models import Conversation, Message, Part
from tests.chat.test_sse import signed_in
from tests.conftest import Daphne, daphne_without_model

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(django_db_setup, service_logs) -> Iterator[Daphne]:
    with daphne_without_model("daphne-ws-direct", service_logs) as daphne:
        yield daphne


def test_frame_headers_for_each_length_encoding():
    assert text_frame(b"hi") == b"\x81\x02hi"
    assert text_frame(b"x" * 126)[:4] == b"\x81\x7e\x00\x7e"
    assert text_frame(b"x" * 70_000)[:10] == b"\x81\x7f" + (70_000).to_bytes(8, "big")


class Server:
    """Stands for daphne.server.Server, whose import installs Twisted's reactor here."""

    __module__ = "daphne.server"

    async def handle_reply(self, protocol, message):
        return None


def test_daphnes_send_is_recognised_and_others_are_not():
    protocol = SimpleNamespace(transport=None, send_queue=[], STATE_OPEN=3)
    assert daphne_protocol(functools.partial(Server().handle_reply, protocol)) is protocol
    assert daphne_protocol(functools.partial(print, protocol)) is None

    async def send(message):
        return None

    assert daphne_protocol(send) is None


def open_socket(server: Daphne, username: str):
    session = signed_in(server, username)
    owner = get_user_model().objects.get(username=username)
    conversation = Conversation.objects.create(owner=owner)
    reply = Message.objects.create(conversation=conversation, role="assistant", position=0)
    part = Part.objects.create(message=reply, index=0, kind="text", state="streaming")
    live_text.reset(part.pk)  # a tail another run left under this part id would be shown
    url = f"{server.ws_url}/ws/conversations/{conversation.pk}/"
    headers = {"Cookie": f"sessionid={session.cookies['sessionid']}", "Origin": server.url}
    return connect(url, additional_headers=headers, open_timeout=10, max_size=None), part


def test_events_of_every_frame_size_arrive_whole_and_in_order(server):
    ws, part = open_socket(server, "frames")
    sizes = [1, 100, 126, 1_000, 65_535, 70_000, 3]
    with ws:
        json.loads(ws.recv(timeout=10))  # the snapshot
        conversation_id = part.message.conversation_id
        for seq, size in enumerate(sizes, start=1):
            events.send(
                conversation_id, events.delta_event(part.pk, part.message_id, seq, "é" * size)
            )
        got = [json.loads(ws.recv(timeout=10)) for _ in sizes]
    assert [(e["seq"], e["text"]) for e in got] == [
        (seq, "é" * size) for seq, size in enumerate(sizes, start=1)
    ]


def test_a_deleted_conversation_closes_the_socket(server):
    ws, part = open_socket(server, "deleted")
    with ws:
        json.loads(ws.recv(timeout=10))
        conversation_id = part.message.conversation_id
        events.send(conversation_id, events.delta_event(part.pk, part.message_id, 1, "a"))
        assert json.loads(ws.recv(timeout=10))["text"] == "a"
        events.send(conversation_id, {"type": "conversation.deleted", "id": conversation_id})
        assert json.loads(ws.recv(timeout=10))["type"] == "conversation.deleted"
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    assert ws.close_code == NOT_FOUND
