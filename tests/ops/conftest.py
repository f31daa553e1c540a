"""Ops page fixtures: a staff member and a signed-in client, and a way to read the feed."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat.models import Conversation, Message, Part


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user("operator", password="op-pass", is_staff=True)


@pytest.fixture
def staff_client(client: Client, staff) -> Client:
    client.force_login(staff)
    return client


def feed(client: Client) -> dict:
    """GET /ops/status.json as the signed-in client; must succeed."""
    response = client.get("/ops/status.json")
    assert response.status_code == 200, response.content
    return response.json()


def banner_components(snapshot: dict) -> set[str]:
    return {banner["component"] for banner in snapshot["banners"]}


def session_cookie(user) -> str:
    """A signed-in session for `user`, as the Cookie header a real server accepts."""
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def make_reply(owner, created_at, states: list[str]) -> Message:
    """An assistant reply started at `created_at` whose parts are in `states` (text first)."""
    conversation = Conversation.objects.create(owner=owner)
    message = Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, position=1
    )
    Message.objects.filter(pk=message.pk).update(created_at=created_at)
    for index, state in enumerate(states):
        kind = Part.Kind.TEXT if index == 0 else Part.Kind.IMAGE
        Part.objects.create(message=message, index=index, kind=kind, state=state)
    return message
