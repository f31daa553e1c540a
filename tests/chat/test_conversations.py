"""Conversations as a whole: born with their first message, renamed, deleted, exported, found.

The real engine in this process where a turn runs, the real Redis for the events (an
`EventTap` listens as a browser's socket does), SQLite here; the PostgreSQL search runs in
tests/chat/test_search_postgres.py.
"""

import json

import pytest
from django.core.files.base import ContentFile
from django.db import connection
from django.test import Client, override_settings

from chat import conversations, export, services
from chat.models import Conversation, Message, Part
from chat.search import conversation_search
from tests.support.media import EventTap
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def wait_final(part_id: int) -> Part:
    wait_until(
        lambda: Part.objects.get(pk=part_id).state not in (Part.State.QUEUED, "streaming"),
        120,
        "the text part to finish",
    )
    return Part.objects.get(pk=part_id)


def test_a_new_conversation_page_saves_nothing(alice):
    client = client_for(alice)
    page = client.get("/c/new")
    assert page.status_code == 200
    assert b'data-turns-url="/c/new/turns"' in page.content
    refused = client.post("/c/new/turns", {"text": "   "}, content_type="application/json")
    assert refused.status_code == 422
    assert client.post("/c/new").status_code == 405  # no row is made by a click any more
    assert not Conversation.objects.exists()


@pytest.mark.model
@override_settings(TANDEM_CHAT_TEMPERATURE=0, TANDEM_CHAT_MAX_NEW_TOKENS=8)
def test_the_first_message_creates_the_conversation(alice, engine_in_process):
    client = client_for(alice)
    answer = client.post(
        "/c/new/turns", {"text": "Say hi."}, content_type="application/json"
    ).json()
    conversation = Conversation.objects.get(owner=alice)
    assert answer["conversation"] == {
        "id": conversation.pk,
        "title": "Say hi.",
        "url": f"/c/{conversation.pk}/",
        "turns_url": f"/c/{conversation.pk}/turns",
        "settings": conversation.effective_settings(),
    }
    assert answer["user"]["position"] == 0 and answer["reply"]["position"] == 1
    wait_final(answer["reply"]["parts"][0]["id"])
    second = client.post(
        answer["conversation"]["turns_url"], {"text": "Again."}, content_type="application/json"
    )
    assert second.status_code == 201
    assert Conversation.objects.count() == 1
    wait_final(second.json()["reply"]["parts"][0]["id"])


def test_rename_saves_the_title_and_tells_the_browsers(alice, bob, conversation):
    with EventTap(conversation.pk) as tap:
        renamed = conversations.conversation_rename(conversation, "  Trip   to <b>Lyon</b> ")
        said = tap.settle()
    assert renamed.title == "Trip to <b>Lyon</b>"
    assert Conversation.objects.get(pk=conversation.pk).title == "Trip to <b>Lyon</b>"
    [event] = [e for e in said if e["type"] == "conversation.state"]
    assert event["conversation"]["id"] == conversation.pk
    assert event["conversation"]["title"] == renamed.title

    for bad, words in (("   ", "cannot be empty"), ("x" * 201, "201 characters; the limit is 200")):
        with pytest.raises(conversations.ConversationInvalid) as refused:
            conversations.conversation_rename(conversation, bad)
        assert words in refused.value.errors["title"]
    assert Conversation.objects.get(pk=conversation.pk).title == "Trip to <b>Lyon</b>"

    url = f"/c/{conversation.pk}/rename"
    answer = client_for(alice).post(url, {"title": ""}, content_type="application/json")
    assert answer.status_code == 422 and answer.json()["errors"] == {
        "title": "A title cannot be empty."
    }
    assert client_for(alice).post(url, {}, content_type="application/json").status_code == 400
    assert (
        client_for(bob).post(url, {"title": "mine"}, content_type="application/json").status_code
        == 404
    )
    ok = client_for(alice).post(url, {"title": "Lyon"}, content_type="application/json")
    assert ok.json()["conversation"]["title"] == "Lyon"


@pytest.mark.model
@override_settings(TANDEM_CHAT_TEMPERATURE=0, TANDEM_CHAT_MAX_NEW_TOKENS=300)
def test_delete_stops_the_work_in_flight_and_removes_the_files(
    alice, bob, conversation, engine_in_process, settings, tmp_path
):
    settings.MEDIA_ROOT = tmp_path
    done = services.turn_create(alice, conversation, "Say hi.", False)
    wait_final(done.parts.get().pk)
    drawn = Part.objects.create(message=done, index=1, kind="image", state="succeeded")
    drawn.image.save("drawn.png", ContentFile(b"\x89PNG picture"))
    picture = tmp_path / drawn.image.name
    assert picture.exists()
    reply = services.turn_create(alice, conversation, "Write a long story about a dragon.", False)
    text = reply.parts.get()
    drawing = Part.objects.create(message=reply, index=1, kind="image", state="running")
    wait_until(lambda: Part.objects.get(pk=text.pk).state == "streaming", 60, "the text to stream")
    assert client_for(bob).post(f"/c/{conversation.pk}/delete").status_code == 404

    with EventTap(conversation.pk) as tap:
        answer = client_for(alice).post(f"/c/{conversation.pk}/delete")
        wait_until(lambda: engine_in_process.stats().running == 0, 30, "the engine to drop it")
        said = tap.settle()
    assert answer.status_code == 200 and answer.json()["redirect"] == "/"
    cancelled = [e["part"]["id"] for e in said if e["type"] == "part.state"]
    assert (
        drawing.pk in cancelled
    )  # the image was cancelled (its worker stops) before the rows went
    assert said[-1] == {"type": "conversation.deleted", "id": conversation.pk}
    assert not picture.exists()
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Part.objects.exists() and not Message.objects.exists()
    for path in (f"/c/{conversation.pk}/", f"/c/{conversation.pk}/export.md"):
        assert client_for(alice).get(path).status_code == 404
    assert client_for(alice).post(f"/c/{conversation.pk}/delete").status_code == 404


def a_partial_conversation(owner) -> Conversation:
    conversation = Conversation.objects.create(owner=owner, title="Kites")
    Message.objects.create(
        conversation=conversation, role="user", position=0, text="Draw a kite.", wants_image=True
    )
    reply = Message.objects.create(
        conversation=conversation, role="assistant", position=1, wants_image=True
    )
    Part.objects.create(
        message=reply, index=0, kind="text", state="succeeded", text="A **red** kite.", seq=3
    )
    Part.objects.create(
        message=reply, index=1, kind="image", state="failed", error="No worker.", attempt=2
    )
    return conversation


def test_export_as_json_keeps_every_part_and_its_state(alice, bob):
    conversation = a_partial_conversation(alice)
    answer = client_for(alice).get(f"/c/{conversation.pk}/export.json")
    assert answer["Content-Disposition"] == f'attachment; filename="kites-{conversation.pk}.json"'
    document = json.loads(answer.content)
    assert document["title"] == "Kites" and document["format_version"] == export.FORMAT_VERSION
    asked, reply = document["messages"]
    assert asked == asked | {"role": "user", "text": "Draw a kite.", "wants_image": True}
    assert reply["status"] == "partial"
    assert [(p["kind"], p["state"]) for p in reply["parts"]] == [
        ("text", "succeeded"),
        ("image", "failed"),
    ]
    assert reply["parts"][0]["text"] == "A **red** kite."
    assert reply["parts"][1] | {"error": "No worker.", "attempt": 2} == reply["parts"][1]
    assert client_for(bob).get(f"/c/{conversation.pk}/export.json").status_code == 404
    assert client_for(alice).get(f"/c/{conversation.pk}/export.txt").status_code == 404


def test_export_as_markdown_says_what_did_not_finish(alice):
    conversation = a_partial_conversation(alice)
    answer = client_for(alice).get(f"/c/{conversation.pk}/export.md")
    assert answer["Content-Type"] == "text/markdown; charset=utf-8"
    assert answer.content.decode() == (
        "# Kites\n\n"
        "## You (asked for an image)\n\nDraw a kite.\n\n"
        "## Tandem (partial)\n\nA **red** kite.\n\n_(image failed: No worker.)_\n"
    )


def test_search_finds_titles_and_words_said_only_among_ones_own(alice, bob):
    kites = a_partial_conversation(alice)
    soup = Conversation.objects.create(owner=alice, title="Dinner")
    Message.objects.create(conversation=soup, role="user", position=0, text="A tomato soup?")
    theirs = a_partial_conversation(bob)
    assert set(conversation_search(alice, "KITE")) == {kites}  # the title, any case
    assert set(conversation_search(alice, "tomato")) == {soup}  # the user's words
    assert set(conversation_search(alice, "red")) == {kites}  # the reply's text
    assert set(conversation_search(alice, "")) == {kites, soup}
    assert set(conversation_search(bob, "kite")) == {theirs}
    page = client_for(alice).get("/", {"q": "tomato"}).content.decode()
    assert f'data-conversation-id="{soup.pk}"' in page
    assert f'data-conversation-id="{kites.pk}"' not in page
    assert "1 match for “tomato”" in page


def test_search_on_postgresql_is_full_text(alice):
    """Run with DATABASE_URL=postgres://…: stemmed words and web-search syntax."""
    if connection.vendor != "postgresql":
        pytest.skip("the full-text search is PostgreSQL's; this run is on " + connection.vendor)
    kites = a_partial_conversation(alice)
    Message.objects.create(
        conversation=kites, role="user", position=2, text="My kites keep crashing in strong winds."
    )
    soup = Conversation.objects.create(owner=alice, title="Dinner")
    Message.objects.create(conversation=soup, role="user", position=0, text="Soup in the wind?")
    assert set(conversation_search(alice, "crash")) == {kites}  # stemmed: crashing
    assert set(conversation_search(alice, "kite")) == {kites}  # title and words
    assert set(conversation_search(alice, "wind")) == {kites, soup}
    assert set(conversation_search(alice, '"strong winds"')) == {kites}  # a phrase
    assert set(conversation_search(alice, "wind -soup")) == {kites}  # minus a word
    assert set(conversation_search(alice, "soup or crash")) == {kites, soup}
    assert set(conversation_search(alice, "red")) == {kites}  # the reply's text
    assert set(conversation_search(alice, "the")) == set()  # a stop word matches nothing
