"""Admin fixtures: replies in any state, the staff users, and posting an admin action."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from chat.models import Conversation, Message, Part

# The real engine and a user, as the chat tests have them (fixtures shared, not copied).
from tests.chat.conftest import alice, conversation, engine_in_process, real_engine  # noqa: F401
from tests.media.conftest import empty_media_queue, media_root  # noqa: F401

PARTS = "/admin/chat/part/"
MESSAGES = "/admin/chat/message/"
CONVERSATIONS = "/admin/chat/conversation/"


def ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def make_reply(
    owner_name: str = "carol",
    text_state: str = Part.State.SUCCEEDED,
    image_state=None,
    **text_fields,
) -> Message:
    """An assistant reply (after the user's words) with a text part and, optionally, an image.

    `text_fields` sets fields of the text part; every part was queued a second ago unless told.
    """
    owner, _ = get_user_model().objects.get_or_create(username=owner_name)
    chat = Conversation.objects.create(owner=owner, title=f"{owner_name}'s chat")
    Message.objects.create(
        conversation=chat, role=Message.Role.USER, position=0, text="Draw a red fox."
    )
    reply = Message.objects.create(
        conversation=chat,
        role=Message.Role.ASSISTANT,
        position=1,
        wants_image=image_state is not None,
    )
    queued = {"queued_at": ago(1), **text_fields}
    Part.objects.create(message=reply, index=0, kind=Part.Kind.TEXT, state=text_state, **queued)
    if image_state is not None:
        Part.objects.create(
            message=reply, index=1, kind=Part.Kind.IMAGE, state=image_state, queued_at=ago(1)
        )
    return reply


def part_of(reply: Message, kind: str) -> Part:
    return Part.objects.get(message=reply, kind=kind)


def post_action(client: Client, url: str, action: str, objects: list) -> set[str]:
    """Run an admin action on `objects` as the changelist's form does; the messages shown."""
    response = client.post(
        url, {"action": action, "_selected_action": [obj.pk for obj in objects]}, follow=True
    )
    assert response.status_code == 200 and response.redirect_chain, response.status_code
    return {str(message) for message in response.context["messages"]}


@pytest.fixture
def staff(db):
    """A staff user who may view parts, messages and conversations, and nothing else."""
    user = get_user_model().objects.create_user("operator", password="op-pass", is_staff=True)
    for codename in ("view_part", "view_message", "view_conversation"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def grant(user, *codenames: str) -> None:
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))


@pytest.fixture
def staff_client(staff) -> Client:
    client = Client()
    client.force_login(staff)
    return client
