"""The admin's actions, through the real services: the state changes and the browser hears it."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings
from django.contrib.admin.models import LogEntry

from chat.models import Part
from tests.admin.conftest import MESSAGES, PARTS, make_reply, part_of, post_action
from tests.support.media import EventTap

pytestmark = pytest.mark.django_db(transaction=True)


def media_queue() -> list[str]:
    """Ids of the render tasks waiting in the real broker's media queue."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange("media", 0, -1)]


def fresh(part: Part) -> Part:
    return Part.objects.get(pk=part.pk)


def test_retry_image_requeues_failed_and_cancelled_images_and_skips_the_rest(admin_client):
    failed = make_reply("ann", "succeeded", image_state="failed")
    cancelled = make_reply("ann", "succeeded", image_state="cancelled")
    running = make_reply("ann", "streaming", image_state="running")
    images = [part_of(reply, "image") for reply in (failed, cancelled, running)]
    text = part_of(failed, "text")
    with EventTap(failed.conversation_id) as tap:
        shown = post_action(admin_client, PARTS, "retry_image", [*images, text])
        states = tap.part_states(images[0].pk)
        statuses = [e["status"] for e in tap.settle() if e["type"] == "message.state"]
    skipped = ", ".join(str(pk) for pk in sorted([text.pk, images[2].pk]))
    assert shown == {
        "2 image(s) queued again",
        f"2 skipped: not a failed or cancelled image (part {skipped})",
    }
    requeued = [fresh(image) for image in images[:2]]
    assert [(p.state, p.attempt) for p in requeued] == [("queued", 2), ("queued", 2)]
    assert sorted(media_queue()) == sorted(p.task_id for p in requeued)
    assert fresh(images[2]).state == "running" and fresh(text).state == "succeeded"
    assert [s["state"] for s in states] == ["queued"] and states[0]["attempt"] == 2
    assert statuses == ["in_progress"]
    assert LogEntry.objects.filter(
        object_id=images[0].pk, change_message__contains="retry"
    ).exists()


def test_cancel_generation_stops_unfinished_parts_like_the_stop_button(admin_client):
    reply = make_reply("ann", "queued", image_state="running")
    done = make_reply("ann", "succeeded", image_state="succeeded")
    text, image = part_of(reply, "text"), part_of(reply, "image")
    with EventTap(reply.conversation_id) as tap:
        shown = post_action(
            admin_client, PARTS, "cancel_generation", [text, image, *done.parts.all()]
        )
        events = tap.settle()
    finished = ", ".join(str(pk) for pk in done.parts.order_by("pk").values_list("pk", flat=True))
    assert shown == {"2 cancelled", f"2 skipped: already finished (part {finished})"}
    assert (fresh(text).state, fresh(image).state) == ("cancelled", "cancelled")
    assert fresh(image).finished_at is not None
    cancelled = {e["part"]["id"] for e in events if e["type"] == "part.state"}
    assert cancelled == {text.pk, image.pk}
    assert [e["status"] for e in events if e["type"] == "message.state"][-1] == "failed"


def test_cancel_of_a_text_streaming_in_another_process_is_skipped_not_faked(admin_client):
    reply = make_reply("ann", "streaming", engine_request_id="part-1-elsewhere")
    shown = post_action(admin_client, PARTS, "cancel_generation", [part_of(reply, "text")])
    assert shown == {
        "1 skipped: not streaming in this web process's engine (mark it failed instead) "
        f"(part {part_of(reply, 'text').pk})"
    }
    assert part_of(reply, "text").state == "streaming"


def test_mark_failed_fails_unfinished_parts_keeping_their_text_and_tells_the_browser(
    admin_client,
):
    reply = make_reply("ann", "streaming", image_state="queued", text="Half a sent", seq=3)
    done = make_reply("ann", "succeeded")
    text, image = part_of(reply, "text"), part_of(reply, "image")
    with EventTap(reply.conversation_id) as tap:
        shown = post_action(admin_client, MESSAGES, "mark_failed", [reply, done])
        events = tap.settle()
    assert shown == {
        "2 marked failed",
        f"1 skipped: already finished (part {part_of(done, 'text').pk})",
    }
    for part in (fresh(text), fresh(image)):
        assert part.state == "failed" and part.error == "Stopped by an operator."
        assert part.finished_at is not None
    assert (fresh(text).text, fresh(text).seq) == ("Half a sent", 3)
    failed = [e["part"] for e in events if e["type"] == "part.state"]
    assert {(p["id"], p["state"]) for p in failed} == {(text.pk, "failed"), (image.pk, "failed")}
    assert [e["status"] for e in events if e["type"] == "message.state"][-1] == "failed"


def test_message_actions_act_on_the_messages_parts(admin_client):
    reply = make_reply("ann", "succeeded", image_state="failed")
    shown = post_action(admin_client, MESSAGES, "retry_image", [reply])
    assert shown == {"1 image(s) queued again"}  # only the image: the text is not in question
    assert part_of(reply, "image").state == "queued"
    shown = post_action(admin_client, MESSAGES, "cancel_generation", [reply])
    assert shown == {
        "1 cancelled",
        f"1 skipped: already finished (part {part_of(reply, 'text').pk})",
    }
    assert part_of(reply, "image").state == "cancelled"
    words = reply.conversation.messages.get(role="user")
    assert post_action(admin_client, MESSAGES, "retry_image", [words]) == {"No parts to act on."}
