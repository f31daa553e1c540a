"""Regenerating a reply: a new version with its parts laid out again, the old ones kept and
browsable, and the model's history built from the versions on screen."""

import json

import pytest
from django.test import Client

from chat import conversations, export, history, services
from chat.models import Conversation, Message, Part
from tests.support.media import EventTap
from tests.support.processes import wait_until

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


def wait_final(message: Message) -> None:
    wait_until(
        lambda: (
            not Part.objects.filter(
                message=message, state__in=["queued", "streaming", "running"]
            ).exists()
        ),
        120,
        "the reply to finish",
    )


def shown_text(message_id: int) -> str:
    message = Message.objects.prefetch_related("parts").get(pk=message_id)
    return "".join(p.text for p in message.shown_parts() if p.kind == "text")


def test_regenerate_keeps_the_old_version_and_the_history_follows_the_one_shown(
    alice, bob, engine_in_process
):
    conversation = Conversation.objects.create(owner=alice, temperature=0.9, max_new_tokens=12)
    reply = services.turn_create(alice, conversation, "Name a colour.", False)
    with pytest.raises(services.TurnRefused) as busy:
        services.reply_regenerate(alice, reply)  # still being written
    assert busy.value.status == 409
    wait_final(reply)
    first = shown_text(reply.pk)

    client = Client()
    client.force_login(alice)
    with EventTap(conversation.pk) as tap:
        answer = client.post(f"/m/{reply.pk}/regenerate")
        said = tap.settle()
    assert answer.status_code == 202
    assert answer.json()["message"] | {"version": 2, "versions": 2} == answer.json()["message"]
    [update] = [e for e in said if e["type"] == "message.update"]
    assert update["message"]["version"] == 2 and len(update["message"]["parts"]) == 1
    new_part = update["message"]["parts"][0]
    assert (new_part["version"], new_part["index"], new_part["kind"]) == (2, 0, "text")
    wait_final(reply)
    assert Part.objects.filter(message=reply).count() == 2  # version 1 kept
    assert Part.objects.get(message=reply, version=1).text == first

    later = services.turn_create(alice, conversation, "Another?", False)
    second = shown_text(reply.pk)
    turns = history.transcript(later)
    assert turns[1] == {"role": "assistant", "content": second}

    wait_final(Message.objects.get(conversation=conversation, position=3))
    shown = client.post(f"/m/{reply.pk}/version", {"version": 1}, content_type="application/json")
    assert shown.status_code == 200 and shown.json()["message"]["version"] == 1
    assert history.transcript(later)[1] == {"role": "assistant", "content": first}
    missing = client.post(f"/m/{reply.pk}/version", {"version": 7}, content_type="application/json")
    assert missing.status_code == 404
    theirs = Client()
    theirs.force_login(bob)
    assert theirs.post(f"/m/{reply.pk}/regenerate").status_code == 404

    document = json.loads(export.as_json(Conversation.objects.get(pk=conversation.pk)))
    exported = document["messages"][1]
    assert exported["version"] == 1 and [v["version"] for v in exported["versions"]] == [1, 2]
    assert exported["versions"][1]["parts"][0]["text"] == second
    assert "(version 1 of 2)" in export.as_markdown(conversation)
    conversations.conversation_delete(conversation)


def test_regenerating_a_turn_with_an_image_lays_out_both_parts_again(alice, engine_in_process):
    conversation = Conversation.objects.create(owner=alice, max_new_tokens=4)
    reply = services.turn_create(alice, conversation, "Draw a boat.", True)
    services.message_stop(reply)
    wait_final(reply)
    services.reply_regenerate(alice, reply)
    again = Part.objects.filter(message=reply, version=2).order_by("index")
    assert [(p.index, p.kind) for p in again] == [(0, "text"), (1, "image")]
    services.message_stop(reply)  # the new image too: nothing is left for a worker
    wait_final(reply)
    assert Part.objects.get(message=reply, version=2, kind="image").state == "cancelled"
