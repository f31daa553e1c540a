"""Who sees what: anonymous and non-staff get nothing; each action needs its own permission."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat.models import Part
from tests.admin.conftest import CONVERSATIONS, MESSAGES, PARTS, grant, make_reply, part_of

pytestmark = pytest.mark.django_db(transaction=True)

ACTIONS = {"retry_image", "cancel_generation", "mark_failed"}


@pytest.fixture
def reply():
    """A partial reply whose words and ids must not leak to anyone without access."""
    reply = make_reply(
        "secretive", "succeeded", image_state="failed", text="The launch code is 0000."
    )
    Part.objects.filter(message=reply, kind="image").update(task_id="task-should-not-leak")
    return reply


def pages(reply) -> list[str]:
    image = part_of(reply, "image")
    return [
        PARTS,
        f"{PARTS}{image.pk}/change/",
        MESSAGES,
        f"{MESSAGES}{reply.pk}/change/",
        CONVERSATIONS,
        f"{CONVERSATIONS}{reply.conversation_id}/change/",
    ]


def assert_nothing_leaks(body: str) -> None:
    for secret in ("launch code", "task-should-not-leak", "secretive"):
        assert secret not in body


@pytest.mark.parametrize("who", ["anonymous", "non-staff"])
def test_anonymous_and_non_staff_are_sent_to_the_login_page_with_no_data(client, reply, who):
    if who == "non-staff":
        user = get_user_model().objects.create_user("visitor", password="v-pass")
        client.force_login(user)
        grant(user, "view_part", "retry_image", "mark_failed")  # no is_staff: still nothing
    for url in pages(reply):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
        assert_nothing_leaks(response.content.decode())
    image = part_of(reply, "image")
    response = client.post(PARTS, {"action": "retry_image", "_selected_action": [image.pk]})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert part_of(reply, "image").state == "failed"


def test_staff_without_view_permission_are_refused(reply):
    user = get_user_model().objects.create_user("clerk", password="c-pass", is_staff=True)
    client = Client()
    client.force_login(user)
    for url in pages(reply):
        response = client.get(url)
        assert response.status_code == 403, url
        assert_nothing_leaks(response.content.decode())


def offered_actions(client: Client, url: str) -> set[str]:
    form = client.get(url).context["action_form"]
    return {name for name, _ in form.fields["action"].choices if name} if form else set()


def test_view_only_staff_see_the_rows_but_no_action(staff_client, reply):
    page = staff_client.get(PARTS)
    assert page.status_code == 200 and "task-should-not-leak" not in page.content.decode()
    assert {part.pk for part in page.context["cl"].result_list} == set(
        reply.parts.values_list("pk", flat=True)
    )
    assert offered_actions(staff_client, PARTS) == set()
    assert offered_actions(staff_client, MESSAGES) == set()
    image = part_of(reply, "image")
    response = staff_client.post(
        PARTS, {"action": "retry_image", "_selected_action": [image.pk]}, follow=True
    )
    assert (
        not list(response.context["messages"]) and "queued again" not in response.content.decode()
    )
    assert part_of(reply, "image").state == "failed"
    detail = staff_client.get(f"{PARTS}{image.pk}/change/").content.decode()
    assert "task-should-not-leak" in detail and 'name="task_id"' not in detail  # read-only


@pytest.mark.parametrize("codename", sorted(ACTIONS))
def test_each_action_needs_its_own_permission(staff, staff_client, reply, codename):
    grant(staff, codename)
    assert offered_actions(staff_client, PARTS) == {codename}
    assert offered_actions(staff_client, MESSAGES) == {codename}
    others = ACTIONS - {codename}
    image = part_of(reply, "image")
    for action in others:
        staff_client.post(PARTS, {"action": action, "_selected_action": [image.pk]})
    assert part_of(reply, "image").state == "failed"  # nothing the others would have done


def test_nobody_adds_edits_or_deletes_rows_by_hand(admin_client, reply):
    image = part_of(reply, "image")
    assert admin_client.get(f"{PARTS}add/").status_code == 403
    assert admin_client.get(f"{CONVERSATIONS}add/").status_code == 403
    response = admin_client.post(f"{PARTS}{image.pk}/change/", {"state": "succeeded"})
    assert response.status_code == 403
    assert admin_client.post(f"{PARTS}{image.pk}/delete/", {"post": "yes"}).status_code == 403
    assert part_of(reply, "image").state == "failed"
    # Conversations alone may be deleted, and only through conversation_delete
    # (tests/admin/test_conversation_delete.py).
    assert "delete_selected" in offered_actions(admin_client, CONVERSATIONS)
