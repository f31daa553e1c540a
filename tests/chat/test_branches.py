"""Editing a sent message: a new branch from that point, the old branch kept and browsable,
the model's history following the branch on screen, the export and the migration keeping it."""

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from chat import branches, conversations, export, history, services
from chat.models import Conversation, Message, Part
from tests.chat.test_versions import shown_text, wait_final
from tests.support.media import EventTap

pytestmark = [pytest.mark.django_db(transaction=True)]


def said(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], m["text"]) for m in messages if m["role"] == "user"]


@pytest.mark.model
def test_an_edit_branches_and_the_old_branch_stays_browsable(alice, bob, engine_in_process):
    conversation = Conversation.objects.create(owner=alice, temperature=0.0, max_new_tokens=6)
    first_reply = services.turn_create(alice, conversation, "Name a colour.", False)
    wait_final(first_reply)
    old_words = shown_text(first_reply.pk)
    second_reply = services.turn_create(alice, conversation, "Name a fruit.", False)
    asked_first = first_reply.parent
    with pytest.raises(services.TurnRefused) as busy:  # a reply is still being written
        services.message_edit(alice, asked_first, "Name a number.")
    assert busy.value.status == 409
    wait_final(second_reply)

    client = Client()
    client.force_login(alice)
    with EventTap(conversation.pk) as tap:
        answer = client.post(
            f"/m/{asked_first.pk}/edit", {"text": "Name a number."}, content_type="application/json"
        )
        events = tap.settle()
    assert answer.status_code == 201, answer.content
    shown = answer.json()["messages"]
    assert said(shown) == [("user", "Name a number.")] and len(shown) == 2
    assert (shown[0]["branch"], shown[0]["branches"], shown[0]["position"]) == (2, 2, 0)
    new_reply = Message.objects.get(pk=answer.json()["reply_id"])
    assert shown[1]["id"] == new_reply.pk and shown[1]["parts"][0]["kind"] == "text"
    [branch_event] = [e for e in events if e["type"] == "conversation.branch"]
    assert [m["id"] for m in branch_event["messages"]] == [m["id"] for m in shown]
    wait_final(new_reply)
    assert history.transcript(new_reply)[0] == {"role": "user", "content": "Name a number."}
    assert len(history.transcript(new_reply)) == 2  # the old branch is not in its prompt
    assert Message.objects.filter(conversation=conversation).count() == 6  # nothing deleted
    assert shown_text(first_reply.pk) == old_words

    back = client.post(
        f"/m/{asked_first.pk}/branch", {"branch": 1}, content_type="application/json"
    )
    assert back.status_code == 200
    assert said(back.json()["messages"]) == [("user", "Name a colour."), ("user", "Name a fruit.")]
    assert back.json()["messages"][0] | {"branch": 1, "branches": 2} == back.json()["messages"][0]
    later = services.turn_create(alice, conversation, "And a city?", False)  # on branch 1
    assert (later.parent.parent_id, later.position) == (second_reply.pk, 5)
    assert [t["content"] for t in history.transcript(later) if t["role"] == "user"] == [
        "Name a colour.",
        "Name a fruit.",
        "And a city?",
    ]
    refused = client.post(  # the new turn is still being written
        f"/m/{asked_first.pk}/branch", {"branch": 2}, content_type="application/json"
    )
    assert refused.status_code == 409
    wait_final(later)
    missing = client.post(
        f"/m/{asked_first.pk}/branch", {"branch": 3}, content_type="application/json"
    )
    assert missing.status_code == 404
    theirs = Client()
    theirs.force_login(bob)
    edit = {"data": {"text": "x"}, "content_type": "application/json"}
    assert theirs.post(f"/m/{asked_first.pk}/edit", **edit).status_code == 404
    assert client.post(f"/m/{first_reply.pk}/edit", **edit).status_code == 404  # not a user's
    empty = client.post(f"/m/{asked_first.pk}/edit", {"text": "  "}, "application/json")
    assert empty.status_code == 422

    document = json.loads(export.as_json(Conversation.objects.get(pk=conversation.pk)))
    assert document["format_version"] == 3
    opening = document["messages"][0]
    assert (opening["text"], opening["branch"], opening["branch_count"]) == ("Name a colour.", 1, 2)
    [other] = opening["branches"]
    assert other["branch"] == 2
    assert [m["role"] for m in other["messages"]] == ["user", "assistant"]
    assert other["messages"][0]["text"] == "Name a number."
    assert other["messages"][1]["parts"][0]["text"] == shown_text(new_reply.pk)
    markdown = export.as_markdown(conversation)
    assert "## You (branch 1 of 2)" in markdown
    assert "Name a number." in markdown and "### Branch 2 of 2" in markdown
    conversations.conversation_delete(conversation)


@pytest.mark.model
def test_the_new_branch_lays_out_text_and_image_again(alice, engine_in_process):
    conversation = Conversation.objects.create(owner=alice, max_new_tokens=4)
    reply = services.turn_create(alice, conversation, "Draw a boat.", True)
    services.message_stop(reply)
    wait_final(reply)
    again = services.message_edit(alice, reply.parent, "Draw a red boat.")
    laid_out = Part.objects.filter(message=again).order_by("index")
    assert [(p.version, p.index, p.kind) for p in laid_out] == [(1, 0, "text"), (1, 1, "image")]
    assert again.wants_image and again.parent.text == "Draw a red boat."
    services.message_stop(again)  # the new image too: nothing is left for a worker
    wait_final(again)
    assert Part.objects.get(message=again, kind="image").state == "cancelled"


def test_a_conversation_never_edited_is_one_branch(alice):
    """Rows written without a parent (fixtures, the rows before branches) follow the message
    one position up: the path is the whole conversation, every message branch 1 of 1."""
    conversation = Conversation.objects.create(owner=alice)
    rows = [
        Message.objects.create(conversation=conversation, role=role, position=n, text=str(n))
        for n, role in enumerate(["user", "assistant", "user", "assistant"])
    ]
    path = branches.shown_path(branches.tree(conversation.pk))
    assert [m.pk for m in path] == [m.pk for m in rows]
    assert set(branches.places(path).values()) == {(1, 1)}
    assert [m.pk for m in branches.lineage(rows[3])] == [m.pk for m in rows]
    assert branches.leaf(conversation.pk).pk == rows[3].pk


def test_the_migration_links_existing_rows_into_one_branch(alice):
    executor = MigrationExecutor(connection)
    executor.migrate([("chat", "0005_part_previous_image")])
    old = executor.loader.project_state([("chat", "0005_part_previous_image")]).apps
    OldConversation = old.get_model("chat", "Conversation")
    OldMessage = old.get_model("chat", "Message")
    conversation = OldConversation.objects.create(owner_id=alice.pk, title="before")
    for n, role in enumerate(["user", "assistant", "user", "assistant"]):
        OldMessage.objects.create(conversation=conversation, role=role, position=n, text=str(n))
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    rows = list(Message.objects.filter(conversation_id=conversation.pk).order_by("position"))
    assert [m.parent_id for m in rows] == [None] + [m.pk for m in rows[:-1]]
    assert all(m.shown for m in rows)
