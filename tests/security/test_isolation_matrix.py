"""Neither user B nor a signed-out visitor reaches anything of user A's, on any transport.

Each cell of the matrix is one request B makes for one of A's objects, over HTTP (pages and
JSON actions), SSE, the WebSocket or the admin, on a real Daphne. B must be refused (404, or
the admin's login redirect; the socket closes 4404 before any frame) and the answer must not
contain any of A's secrets. The same request made by A must succeed or be refused for another
reason than ownership, so a refusal cannot come from a route that simply does not exist.
A signed-out visitor making the same requests gets the login redirect, 401, 403 or 4401.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
import requests
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.urls import reverse

from chat.models import Conversation, Message, Part
from tests.chat.test_sse import signed_in
from tests.chat_ui.test_security import first_frame

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = f"alice-secret-{uuid.uuid4().hex[:8]}"


def a_conversation(owner) -> dict:
    """A's conversation with a question, a text answer and a drawn image, all holding SECRET."""
    conversation = Conversation.objects.create(owner=owner, title=f"{SECRET} title")
    question = Message.objects.create(
        conversation=conversation, role="user", position=0, text=f"{SECRET} question"
    )
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    text = Part.objects.create(
        message=reply, index=0, kind="text", state="succeeded", text=f"{SECRET} answer", seq=1
    )
    image = Part.objects.create(message=reply, index=1, kind="image", state="succeeded")
    image.image.save("picture.png", ContentFile(b"\x89PNG " + SECRET.encode()))
    return {
        "conversation": conversation,
        "question": question,
        "reply": reply,
        "text": text,
        "image": image,
    }


def http_cells(objects: dict) -> list[tuple[str, str, str, dict | None]]:
    """(transport, method, path, JSON body) for every chat route that takes one of A's ids."""
    conversation, reply = objects["conversation"].pk, objects["reply"].pk
    return [
        ("http", "GET", f"/c/{conversation}/", None),
        ("http", "POST", f"/c/{conversation}/turns", {"text": " "}),
        ("http", "POST", f"/m/{reply}/stop", None),
        ("http", "POST", f"/parts/{objects['image'].pk}/retry", None),
        ("http", "GET", f"/media/{objects['image'].image.name}", None),
        ("http", "POST", f"/c/{conversation}/rename", {"title": "taken"}),
        ("http", "POST", f"/c/{conversation}/settings", {"temperature": 1}),
        ("http", "POST", f"/m/{reply}/version", {"version": 1}),
        ("http", "GET", f"/c/{conversation}/export.md", None),
        ("http", "GET", f"/c/{conversation}/export.json", None),
        ("sse", "GET", f"/m/{reply}/events", None),
    ]


def admin_cells(objects: dict) -> list[tuple[str, str, str, dict | None]]:
    """The admin index, and each registered chat model's changelist and A's change page."""
    cells = [("admin", "GET", reverse("admin:index"), None)]
    for key in ("conversation", "question", "text"):
        model = objects[key]._meta
        if objects[key].__class__ not in admin.site._registry:
            continue
        name = f"admin:{model.app_label}_{model.model_name}"
        cells.append(("admin", "GET", reverse(f"{name}_changelist"), None))
        cells.append(("admin", "GET", reverse(f"{name}_change", args=[objects[key].pk]), None))
    return cells


def call(server, session: requests.Session, method: str, path: str, body) -> requests.Response:
    headers = {"X-CSRFToken": session.cookies.get("csrftoken", ""), "Referer": server.url}
    return session.request(
        method,
        server.url + path,
        json=body,
        headers=headers if method == "POST" else {},
        allow_redirects=False,
        timeout=30,
    )


# Login redirect (pages, admin), 401 (SSE), or 403 (a POST without the CSRF cookie).
ANONYMOUS_REFUSALS = (302, 401, 403)


def leaked(response: requests.Response) -> bool:
    return SECRET.encode() in response.content


def refused_to_intruder(transport: str, response: requests.Response) -> bool:
    if transport == "admin":
        return response.status_code == 302 and "/admin/login/" in response.headers["Location"]
    return response.status_code == 404


def test_user_b_reaches_nothing_of_user_a(daphne):
    alice_name = f"alice-{uuid.uuid4().hex[:6]}"
    alice_session = signed_in(daphne, alice_name)
    bob_session = signed_in(daphne, f"bob-{uuid.uuid4().hex[:6]}")
    alice = get_user_model().objects.get(username=alice_name)
    objects = a_conversation(alice)
    try:
        cells = http_cells(objects) + admin_cells(objects)
        checked, failures = Counter(), []
        for transport, method, path, body in cells:
            mine = call(daphne, alice_session, method, path, body)
            theirs = call(daphne, bob_session, method, path, body)
            anonymous = call(daphne, requests.Session(), method, path, body)
            mine.close()
            checked[transport] += 2
            if anonymous.status_code not in ANONYMOUS_REFUSALS or leaked(anonymous):
                failures.append(f"anonymous got {anonymous.status_code} on {method} {path}")
            if leaked(theirs):
                failures.append(f"B's answer to {method} {path} holds A's secret")
            if transport != "admin" and mine.status_code == 404:
                failures.append(f"owner got 404 on {method} {path}: the route does not exist?")
            if not refused_to_intruder(transport, theirs):
                failures.append(f"B got {theirs.status_code} on {method} {path}")

        url = f"{daphne.ws_url}/ws/conversations/{objects['conversation'].pk}/"
        owner_frame = first_frame(
            url, f"sessionid={alice_session.cookies['sessionid']}", daphne.url
        )
        assert owner_frame["type"] == "snapshot" and SECRET in str(owner_frame)
        intruder = first_frame(url, f"sessionid={bob_session.cookies['sessionid']}", daphne.url)
        checked["websocket"] += 2
        if intruder != 4404 or SECRET in str(intruder):
            failures.append(f"B's socket got {intruder!r}")
        if first_frame(url, "", daphne.url) != 4401:
            failures.append("an anonymous socket was not closed with 4401")

        home = bob_session.get(daphne.url + "/", timeout=30)
        checked["http"] += 1
        if leaked(home):
            failures.append("B's conversation list holds A's secret")
        found = bob_session.get(daphne.url + "/", params={"q": SECRET}, timeout=30)
        checked["http"] += 1
        if f'data-conversation-id="{objects["conversation"].pk}"' in found.text:
            failures.append("B's search for A's words lists A's conversation")

        # Deleting last: B's and an anonymous try must leave A's conversation standing.
        delete = f"/c/{objects['conversation'].pk}/delete"
        theirs = call(daphne, bob_session, "POST", delete, None)
        anonymous = call(daphne, requests.Session(), "POST", delete, None)
        checked["http"] += 2
        if theirs.status_code != 404 or anonymous.status_code not in ANONYMOUS_REFUSALS:
            failures.append(
                f"delete: B got {theirs.status_code}, anonymous {anonymous.status_code}"
            )
        if not Conversation.objects.filter(pk=objects["conversation"].pk).exists():
            failures.append("A's conversation was deleted by someone else")

        registered = [c for c in cells if c[0] == "admin"]
        print(
            f"\nisolation matrix: {sum(checked.values())} requests by B or anonymous for A's "
            f"objects ({dict(checked)}), {len(registered) - 1} chat admin pages, "
            f"refusals missed or leaks = {len(failures)}"
        )
        assert failures == []
        assert len(registered) - 1 >= 6  # A's conversation, message and part, list and page
    finally:
        objects["image"].image.delete(save=False)
