"""The changelists: derived columns agree with the chat's own rules, and cost bounded queries."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat.admin import readable
from chat.admin_queries import message_status
from chat.models import Conversation, Message, Part
from chat.states import message_status as derived_status
from tests.admin.conftest import CONVERSATIONS, MESSAGES, PARTS, make_reply, part_of

pytestmark = pytest.mark.django_db

TEXT_STATES = ["queued", "streaming", "succeeded", "failed", "cancelled", "interrupted"]
IMAGE_STATES = ["queued", "running", "succeeded", "failed", "cancelled"]


def test_the_status_subquery_agrees_with_the_chat_for_every_combination_of_states():
    expected = {}
    combos = [(t, None) for t in TEXT_STATES] + list(itertools.product(TEXT_STATES, IMAGE_STATES))
    for text_state, image_state in combos:
        reply = make_reply(text_state=text_state, image_state=image_state)
        states = [s for s in (text_state, image_state) if s]
        expected[reply.pk] = derived_status(states)
    annotated = Message.objects.filter(pk__in=expected).annotate(status=message_status("pk"))
    assert {m.pk: m.status for m in annotated} == expected
    assert set(expected.values()) == {"in_progress", "complete", "partial", "failed"}
    user_message = Message.objects.filter(role="user").annotate(status=message_status("pk"))
    assert {m.status for m in user_message} == {None}  # no parts: no status shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0123, "12 ms"),
        (0.85, "850 ms"),
        (2.44, "2.4 s"),
        (59.9, "59.9 s"),
        (192, "3 min 12 s"),
        (300, "5 min"),
    ],
)
def test_durations_read_in_the_unit_that_fits(seconds, shown):
    assert readable(timedelta(seconds=seconds)) == shown


def test_a_part_row_shows_owner_links_status_timings_tokens_and_error(admin_client):
    start = timezone.now() - timedelta(seconds=10)
    reply = make_reply(
        "dora",
        Part.State.FAILED,
        image_state=Part.State.SUCCEEDED,
        queued_at=start,
        started_at=start + timedelta(milliseconds=40),
        first_token_at=start + timedelta(milliseconds=290),
        finished_at=start + timedelta(seconds=3.24),
        prompt_tokens=31,
        completion_tokens=57,
        attempt=2,
        error="The engine failed while writing this reply: boom",
    )
    text = part_of(reply, "text")
    page = admin_client.get(PARTS, {"kind": "text"}).content.decode()
    row = page[page.index(f'value="{text.pk}"') :].split("</tr>")[0]
    for cell in ("dora", "Text", "Failed", "Partial", "40 ms", "250 ms", "3.2 s", ">31<", ">57<"):
        assert cell in row, cell
    assert ">2<" in row and "The engine failed while writing this reply: boom" in row
    assert f'href="/admin/chat/message/{reply.pk}/change/"' in row
    assert f'href="/admin/chat/conversation/{reply.conversation_id}/change/"' in row


def test_a_message_page_lists_its_parts_read_only_with_their_state(admin_client):
    reply = make_reply("dora", Part.State.SUCCEEDED, image_state=Part.State.FAILED)
    page = admin_client.get(f"{MESSAGES}{reply.pk}/change/").content.decode()
    assert "Partial" in page and "Succeeded" in page and "Failed" in page
    assert "<p>None</p>" not in page  # an image has no tokens: shown as "-", not "None"
    image = part_of(reply, "image")
    assert f"/admin/chat/part/{image.pk}/change/" in page
    assert 'name="parts-0-state"' not in page and "<select" not in page.split("parts-group")[1]
    part_page = admin_client.get(f"{PARTS}{image.pk}/change/").content.decode()
    assert "queued at" in part_page.lower() and 'name="queued_at"' not in part_page
    assert 'name="state"' not in part_page and 'type="submit" value="Save"' not in part_page


def ten_thousand_parts() -> None:
    """100 users' 500 conversations with 5,000 replies of a text and an image part each."""
    users = get_user_model().objects.bulk_create(
        get_user_model()(username=f"user{n}") for n in range(100)
    )
    conversations = Conversation.objects.bulk_create(
        Conversation(owner=users[n % 100], title=f"chat {n}") for n in range(500)
    )
    replies = Message.objects.bulk_create(
        Message(conversation=conversations[n % 500], role="assistant", position=n // 500)
        for n in range(5000)
    )
    now = timezone.now()
    text_states = itertools.cycle(TEXT_STATES)
    image_states = itertools.cycle(IMAGE_STATES)
    parts = []
    for n, reply in enumerate(replies):
        queued = now - timedelta(seconds=n)
        timings = {
            "queued_at": queued,
            "started_at": queued + timedelta(milliseconds=30),
            "first_token_at": queued + timedelta(milliseconds=300),
            "finished_at": queued + timedelta(seconds=2),
        }
        parts.append(Part(message=reply, index=0, kind="text", state=next(text_states), **timings))
        parts.append(
            Part(message=reply, index=1, kind="image", state=next(image_states), **timings)
        )
    Part.objects.bulk_create(parts, batch_size=2000)


QUERY_BUDGET = 6  # session, user, count, page rows (+ the page's parts): never one per row


@pytest.mark.parametrize(
    ("url", "query"),
    [
        (PARTS, {}),
        (PARTS, {"status": "in_progress", "stuck": "yes", "o": "-8"}),
        (PARTS, {"status": "partial", "queued_at__gte": "2000-01-01 00:00:00+00:00"}),
        (PARTS, {"q": "user7", "kind": "image", "state": "failed"}),
        (MESSAGES, {}),
        (MESSAGES, {"status": "in_progress", "stuck": "no"}),
        (CONVERSATIONS, {}),
    ],
)
def test_changelists_of_ten_thousand_parts_take_a_bounded_number_of_queries(
    admin_client, django_assert_max_num_queries, url, query
):
    ten_thousand_parts()
    assert Part.objects.count() == 10_000
    started = time.monotonic()
    with django_assert_max_num_queries(QUERY_BUDGET):
        response = admin_client.get(url, query)
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 100
    assert elapsed < 20, f"{url} {query} took {elapsed:.1f} s"  # a loaded 2-core machine
