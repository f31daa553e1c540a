"""Filters and search of the part and message changelists, on rows the chat could have written."""

from __future__ import annotations

import pytest
from django.test import override_settings

from chat.models import Message, Part
from tests.admin.conftest import MESSAGES, PARTS, ago, make_reply, part_of

pytestmark = pytest.mark.django_db


def listed(client, url: str, **query) -> set[int]:
    response = client.get(url, query)
    assert response.status_code == 200
    return {obj.pk for obj in response.context["cl"].result_list}


@pytest.fixture
def replies() -> dict[str, Message]:
    """One reply per message status, plus an old unfinished one (stuck)."""
    return {
        "complete": make_reply("ann", "succeeded", image_state="succeeded", text="A red fox."),
        "partial": make_reply("ben", "succeeded", image_state="failed", text="Foxes are red."),
        "failed": make_reply("ann", "failed", image_state="cancelled"),
        "in_progress": make_reply("ben", "streaming", image_state="running"),
        "stuck": make_reply("cat", "streaming", image_state="queued", queued_at=ago(400)),
    }


def parts(replies: dict[str, Message], *names: str, kind: str | None = None) -> set[int]:
    chosen = Part.objects.filter(message__in=[replies[name] for name in names])
    return set((chosen.filter(kind=kind) if kind else chosen).values_list("pk", flat=True))


@pytest.mark.parametrize("status", ["complete", "partial", "failed"])
def test_message_status_filter_on_parts_and_messages(admin_client, replies, status):
    assert listed(admin_client, PARTS, status=status) == parts(replies, status)
    assert listed(admin_client, MESSAGES, status=status) == {replies[status].pk}


def test_in_progress_covers_every_reply_with_an_unfinished_part(admin_client, replies):
    unfinished = parts(replies, "in_progress", "stuck")
    assert listed(admin_client, PARTS, status="in_progress") == unfinished
    expected = {replies["in_progress"].pk, replies["stuck"].pk}
    assert listed(admin_client, MESSAGES, status="in_progress") == expected


@override_settings(TANDEM_STUCK_AFTER=300)
def test_stuck_is_unfinished_longer_than_the_threshold(admin_client, replies):
    # The stuck reply's text was queued 400 s ago; its image 1 s ago.
    stuck_text = part_of(replies["stuck"], "text").pk
    assert listed(admin_client, PARTS, stuck="yes") == {stuck_text}
    assert stuck_text not in listed(admin_client, PARTS, stuck="no")
    assert listed(admin_client, MESSAGES, stuck="yes") == {replies["stuck"].pk}
    # A finished part is never stuck, however old.
    Part.objects.filter(message=replies["complete"]).update(queued_at=ago(10_000))
    assert listed(admin_client, PARTS, stuck="yes") == {stuck_text}
    with override_settings(TANDEM_STUCK_AFTER=0):
        assert listed(admin_client, PARTS, stuck="yes") == parts(replies, "in_progress", "stuck")


def test_state_kind_and_date_filters(admin_client, replies):
    failed = {part_of(replies["partial"], "image").pk, part_of(replies["failed"], "text").pk}
    assert listed(admin_client, PARTS, state="failed") == failed
    assert listed(admin_client, PARTS, kind="image", state="succeeded") == {
        part_of(replies["complete"], "image").pk
    }
    old = part_of(replies["stuck"], "text")
    Part.objects.filter(pk=old.pk).update(queued_at=ago(3 * 86_400))
    [dates] = [
        spec
        for spec in admin_client.get(PARTS).context["cl"].filter_specs
        if getattr(spec, "field_path", "") == "queued_at"
    ]
    today = dict(dates.links)["Today"]  # the filter's own link, as an operator clicks it
    assert old.pk not in listed(admin_client, PARTS, **today)
    assert len(listed(admin_client, PARTS, **today)) == 9


def test_search_by_engine_request_id_task_id_user_and_text(admin_client, replies):
    text = part_of(replies["in_progress"], "text")
    image = part_of(replies["in_progress"], "image")
    Part.objects.filter(pk=text.pk).update(engine_request_id="part-7-abcd1234")
    Part.objects.filter(pk=image.pk).update(task_id="1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed")
    assert listed(admin_client, PARTS, q="part-7-abcd1234") == {text.pk}
    assert listed(admin_client, PARTS, q="1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed") == {image.pk}
    assert listed(admin_client, PARTS, q="part-7") == set()  # ids match exactly
    assert listed(admin_client, PARTS, q="cat") == parts(replies, "stuck")
    assert listed(admin_client, PARTS, q="foxes") == {part_of(replies["partial"], "text").pk}
    assert listed(admin_client, MESSAGES, q="part-7-abcd1234") == {replies["in_progress"].pk}
    user_words = listed(admin_client, MESSAGES, q="red fox")
    assert user_words and all(Message.objects.get(pk=pk).role == "user" for pk in user_words)
