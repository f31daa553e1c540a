"""Deleting conversations from the admin goes through `conversation_delete`, as the owner's
button does: work in flight is cancelled, image files removed, open pages told."""

from __future__ import annotations

import pytest
from django.core.files.base import ContentFile

from chat.models import Conversation, Message, Part
from tests.admin.conftest import CONVERSATIONS, grant, make_reply, part_of
from tests.admin.test_permissions import offered_actions
from tests.support.media import EventTap

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_delete_button_uses_the_service(admin_client, media_root):
    reply = make_reply("ann", "succeeded", image_state="running")
    done = make_reply("ann", "succeeded", image_state="succeeded")
    picture = part_of(done, "image")
    picture.image.save("fox.png", ContentFile(b"\x89PNG fox"))
    file = media_root / picture.image.name
    running = part_of(reply, "image")
    page = f"{CONVERSATIONS}{reply.conversation_id}/delete/"
    confirm = admin_client.get(page)
    assert confirm.status_code == 200
    body = confirm.content.decode()
    assert f"user #0 of {reply.conversation_id}" in body  # what goes with it is listed
    assert "text part 0 of message" in body
    assert "permission to delete" not in body
    with EventTap(reply.conversation_id) as tap:
        admin_client.post(page, {"post": "yes"})
        said = tap.settle()
    cancelled = [e["part"] for e in said if e["type"] == "part.state"]
    assert [(p["id"], p["state"]) for p in cancelled] == [(running.pk, "cancelled")]
    assert said[-1] == {"type": "conversation.deleted", "id": reply.conversation_id}
    assert not Conversation.objects.filter(pk=reply.conversation_id).exists()
    assert not Part.objects.filter(message=reply).exists()

    admin_client.post(
        CONVERSATIONS,
        {"action": "delete_selected", "_selected_action": [done.conversation_id], "post": "yes"},
    )
    assert not file.exists()  # the service removed the picture; a plain delete leaves it
    assert not Message.objects.exists()


def test_deleting_needs_the_delete_permission(staff, staff_client):
    reply = make_reply("ann")
    page = f"{CONVERSATIONS}{reply.conversation_id}/delete/"
    assert "delete_selected" not in offered_actions(staff_client, CONVERSATIONS)
    assert staff_client.post(page, {"post": "yes"}).status_code == 403
    assert Conversation.objects.filter(pk=reply.conversation_id).exists()
    grant(staff, "delete_conversation")
    assert "delete_selected" in offered_actions(staff_client, CONVERSATIONS)
    staff_client.post(page, {"post": "yes"})
    assert not Conversation.objects.filter(pk=reply.conversation_id).exists()
