"""A socket opened while the database is unavailable is closed with 4503, not a traceback:
the session's user cannot be loaded (the middleware), or the consumer's own read fails.

The unavailable database is an OperationalError raised where the query would run; the chaos
scenario tests/chaos/test_pg_outage_images.py stops a real PostgreSQL for the same paths.
"""

import logging

import pytest
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.db import OperationalError

from chat import consumers
from chat.routing import websocket_urlpatterns
from chat.socket_auth import DATABASE_UNAVAILABLE, session_auth_stack

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def unavailable(*args, **kwargs):
    raise OperationalError("PostgreSQL is unavailable; the connection was not attempted.")


async def closed_with(communicator: WebsocketCommunicator) -> int:
    connected, _ = await communicator.connect(timeout=10)
    assert connected  # accepted, so that the browser sees the code
    closing = await communicator.receive_output(timeout=10)
    assert closing["type"] == "websocket.close"
    return closing["code"]


async def test_a_user_that_cannot_be_loaded_closes_the_socket_with_4503(
    conversation, monkeypatch, caplog
):
    monkeypatch.setattr("chat.socket_auth.get_user", unavailable)
    app = session_auth_stack(URLRouter(websocket_urlpatterns))
    communicator = WebsocketCommunicator(app, f"/ws/conversations/{conversation.pk}/")
    with caplog.at_level(logging.WARNING, logger="chat.socket_auth"):
        assert await closed_with(communicator) == DATABASE_UNAVAILABLE
    assert "closed with 4503: database unavailable" in caplog.text
    assert "Traceback" not in caplog.text


async def test_a_consumer_read_that_finds_the_database_gone_closes_with_4503(
    alice, conversation, monkeypatch
):
    monkeypatch.setattr(consumers.Conversation.objects, "filter", unavailable)
    app = URLRouter(websocket_urlpatterns)
    communicator = WebsocketCommunicator(app, f"/ws/conversations/{conversation.pk}/")
    communicator.scope["user"] = alice
    assert await closed_with(communicator) == DATABASE_UNAVAILABLE


async def test_a_snapshot_that_finds_the_database_gone_closes_with_4503(
    alice, conversation, monkeypatch
):
    monkeypatch.setattr(consumers, "conversation_snapshot", unavailable)
    app = URLRouter(websocket_urlpatterns)
    communicator = WebsocketCommunicator(app, f"/ws/conversations/{conversation.pk}/")
    communicator.scope["user"] = alice
    assert await closed_with(communicator) == DATABASE_UNAVAILABLE
