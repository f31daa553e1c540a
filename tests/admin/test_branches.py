"""The admin shows which branch each message is (of its edits) and which version of a reply
is on screen, for every branch of a conversation."""

import pytest
from django.contrib.auth import get_user_model

from chat.models import Conversation, Message, Part
from tests.admin.conftest import CONVERSATIONS, MESSAGES

pytestmark = pytest.mark.django_db


def edited_conversation() -> tuple[Conversation, list[Message]]:
    """A first message edited once (branch 2 shown), the old branch's reply regenerated."""
    owner = get_user_model().objects.create(username="erin")
    chat = Conversation.objects.create(owner=owner, title="edited")
    first = Message.objects.create(
        conversation=chat, role="user", position=0, text="Name a colour.", shown=False
    )
    old_reply = Message.objects.create(
        conversation=chat, role="assistant", position=1, parent=first, shown_version=1
    )
    edit = Message.objects.create(conversation=chat, role="user", position=0, text="Name a fish.")
    new_reply = Message.objects.create(conversation=chat, role="assistant", position=1, parent=edit)
    for version in (1, 2):
        Part.objects.create(
            message=old_reply, version=version, index=0, kind="text", state="succeeded"
        )
    Part.objects.create(message=new_reply, index=0, kind="text", state="succeeded")
    return chat, [first, old_reply, edit, new_reply]


def test_messages_show_their_branch_and_version(admin_client):
    chat, (first, old_reply, edit, new_reply) = edited_conversation()
    listing = admin_client.get(MESSAGES)
    rows = {m.pk: m for m in listing.context["cl"].result_list}
    assert (rows[first.pk].branch_number, rows[first.pk].branch_total) == (1, 2)
    assert (rows[edit.pk].branch_number, rows[edit.pk].branch_total) == (2, 2)
    assert (rows[new_reply.pk].branch_number, rows[new_reply.pk].branch_total) == (1, 1)
    assert rows[old_reply.pk].version_total == 2
    page = admin_client.get(f"{MESSAGES}{old_reply.pk}/change/").content.decode()
    assert "1 / 2" in page and f"/admin/chat/message/{first.pk}/change/" in page  # follows
    edited = admin_client.get(f"{MESSAGES}{edit.pk}/change/").content.decode()
    assert "2 / 2" in edited
    whole = admin_client.get(f"{CONVERSATIONS}{chat.pk}/change/").content.decode()
    assert "Name a colour." in whole and "Name a fish." in whole  # every branch is listed
