"""Who may see /ops/, the admin's link to it, and the reply-status counts over time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat.models import Conversation, Message, Part
from ops.chart import HEIGHT
from ops.snapshot import status_counts
from tests.ops.conftest import make_reply

S = Part.State


@pytest.mark.django_db
def test_anonymous_visitors_are_sent_to_the_login_and_get_no_data(client):
    page = client.get("/ops/")
    assert page.status_code == 302 and page["Location"].startswith("/admin/login/?next=/ops/")
    feed = client.get("/ops/status.json")
    assert feed.status_code == 403 and feed.json() == {"error": "Staff only."}


@pytest.mark.django_db
def test_signed_in_non_staff_get_nothing(client):
    client.force_login(get_user_model().objects.create_user("plain", password="pw"))
    assert client.get("/ops/").status_code == 302
    assert client.get("/ops/status.json").status_code == 403


def test_staff_get_the_page_and_the_admin_links_to_it(staff_client):
    page = staff_client.get("/ops/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="ops-panels"' in html and 'data-feed="/ops/status.json"' in html
    assert "js/ops.js" in html and "no-cache" in page["Cache-Control"]
    admin = staff_client.get("/admin/").content.decode()
    assert '<a href="/ops/" id="ops-link">Operations</a>' in admin


def test_replies_are_counted_per_hour_by_derived_status(staff, django_assert_num_queries):
    now = timezone.now().replace(minute=30)
    hour_ago = now - timedelta(hours=1)
    make_reply(staff, now, [S.SUCCEEDED, S.SUCCEEDED])
    make_reply(staff, now, [S.SUCCEEDED, S.FAILED])
    make_reply(staff, now, [S.STREAMING, S.RUNNING])
    make_reply(staff, hour_ago, [S.SUCCEEDED])
    make_reply(staff, hour_ago, [S.CANCELLED, S.FAILED])
    make_reply(staff, now - timedelta(hours=30), [S.SUCCEEDED])  # outside the 24 hours
    user_message = Message.objects.create(
        conversation=Conversation.objects.create(owner=staff), role=Message.Role.USER, position=0
    )
    assert user_message.parts.count() == 0
    with django_assert_num_queries(1):
        counts = status_counts(now)
    buckets = counts["buckets"]
    assert len(buckets) == 24 and buckets[-1]["start"] == now.replace(
        minute=0, second=0, microsecond=0
    )
    assert buckets[-1]["counts"] == {"complete": 1, "partial": 1, "in_progress": 1, "failed": 0}
    assert buckets[-2]["counts"] == {"complete": 1, "partial": 0, "in_progress": 0, "failed": 1}
    assert all(sum(bucket["counts"].values()) == 0 for bucket in buckets[:-2])
    assert counts["totals"] == {"complete": 2, "partial": 1, "in_progress": 1, "failed": 1}


def test_the_page_shows_the_counts_and_draws_them(staff, staff_client):
    make_reply(staff, timezone.now(), [S.SUCCEEDED, S.FAILED])
    make_reply(staff, timezone.now(), [S.SUCCEEDED, S.SUCCEEDED])
    html = staff_client.get("/ops/").content.decode()
    assert '<strong data-field="messages.partial">1</strong>' in html
    assert '<strong data-field="messages.complete">1</strong>' in html
    # The current hour's bar is two equal segments, each half the plot's height.
    assert html.count('class="ops-status-partial" x=') == 1
    assert html.count(f'height="{HEIGHT / 2:.2f}"></rect>') == 2
