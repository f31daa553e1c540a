"""A WebSocket frame travels through the Redis channel layer on a real Daphne and back."""

import asyncio
import json

import pytest
import websockets
from django.contrib.auth import get_user_model
from django.test import Client


def session_cookie(username: str) -> str:
    """Log a fresh user in and return the Cookie header a browser would send."""
    user = get_user_model().objects.create_user(username, password="pw-" + username)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


async def echo_once(url: str, headers: dict[str, str], payload: dict) -> dict:
    async with websockets.connect(url, additional_headers=headers, open_timeout=10) as ws:
        await ws.send(json.dumps(payload))
        return json.loads(await asyncio.wait_for(ws.recv(), timeout=10))


@pytest.mark.django_db(transaction=True)
def test_echo_goes_through_the_channel_layer(daphne):
    headers = {"Cookie": session_cookie("alice"), "Origin": daphne.url}
    reply = asyncio.run(echo_once(f"{daphne.ws_url}/ws/diagnostics/echo/", headers, {"n": 1}))
    assert reply == {"echo": {"n": 1}, "via": "channel_layer"}


@pytest.mark.django_db(transaction=True)
def test_anonymous_socket_is_closed(daphne):
    async def attempt():
        async with websockets.connect(
            f"{daphne.ws_url}/ws/diagnostics/echo/", additional_headers={"Origin": daphne.url}
        ) as ws:
            await asyncio.wait_for(ws.recv(), timeout=10)

    with pytest.raises((websockets.ConnectionClosed, websockets.InvalidStatus)):
        asyncio.run(attempt())


@pytest.mark.django_db(transaction=True)
def test_foreign_origin_is_refused(daphne):
    headers = {"Cookie": session_cookie("bob"), "Origin": "http://evil.example"}
    with pytest.raises(websockets.InvalidStatus) as refused:
        asyncio.run(echo_once(f"{daphne.ws_url}/ws/diagnostics/echo/", headers, {}))
    assert refused.value.response.status_code == 403
