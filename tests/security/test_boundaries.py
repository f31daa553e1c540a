"""API keys, CSRF and the WebSocket origin check, each over every route it guards.

The key matrix runs on a Daphne that serves no model (TANDEM_LOAD_MODEL=0): the key is checked
before the engine is, so a valid key gets the engine's 503 and any invalid one a 401.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from chat.models import Conversation, Message, Part
from tests.chat.test_sse import signed_in
from tests.chat_ui.test_security import first_frame
from tests.conftest import start_daphne
from tests.support.http import get, post_json

pytestmark = pytest.mark.django_db(transaction=True)

KEY = f"key-{uuid.uuid4().hex}"
API_ROUTES = [
    ("POST", "/", {"inputs": "Hi"}),
    ("POST", "/generate", {"inputs": "Hi"}),
    ("POST", "/generate", [{"id": "a", "prompt": "Hi"}]),
    ("POST", "/generate_stream", {"inputs": "Hi"}),
    ("POST", "/v1/completions", {"model": "m", "prompt": "Hi"}),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
    ),
    ("GET", "/v1/models", None),
]
BAD_CREDENTIALS = {
    "no header": {},
    "wrong key": {"Authorization": "Bearer not-the-key"},
    "key as basic auth": {"Authorization": f"Basic {KEY}"},
    "empty bearer": {"Authorization": "Bearer "},
    "key prefix": {"Authorization": f"Bearer {KEY[:-1]}"},
    "key plus suffix": {"Authorization": f"Bearer {KEY}x"},
    "key in another header": {"X-Api-Key": KEY},
}


@pytest.fixture(scope="module")
def keyed_server(django_db_setup, service_logs):
    server = start_daphne(
        "daphne-keys", service_logs, TANDEM_API_KEYS=f"other,{KEY}", TANDEM_LOAD_MODEL="0"
    )
    try:
        yield server
    finally:
        server.service.stop()


def request(server, method: str, path: str, body, headers: dict):
    if method == "GET":
        return get(server.url + path, headers)
    return post_json(server.url + path, body, headers)


def test_api_keys_are_enforced_on_every_route(keyed_server):
    outcomes = Counter()
    for method, path, body in API_ROUTES:
        for name, headers in BAD_CREDENTIALS.items():
            status, answer_headers, _ = request(keyed_server, method, path, body, headers)
            outcomes[status] += 1
            assert status == 401, (path, name)
            assert answer_headers["WWW-Authenticate"].startswith("Bearer")
        status, _, answer = request(
            keyed_server, method, path, body, {"Authorization": f"Bearer {KEY}"}
        )
        outcomes[status] += 1
        assert status == 503 and "TANDEM_LOAD_MODEL=0" in str(answer), path
    print(
        f"\napi keys: {len(API_ROUTES)} routes x {len(BAD_CREDENTIALS) + 1} credentials, "
        f"statuses {dict(outcomes)}"
    )
    assert get(f"{keyed_server.url}/openapi.json")[0] == 200  # the document stays public


def owner_with_conversation(server, prefix: str):
    username = f"{prefix}-{uuid.uuid4().hex[:6]}"
    session = signed_in(server, username)
    owner = get_user_model().objects.get(username=username)
    return session, Conversation.objects.create(owner=owner)


def test_every_state_changing_chat_route_needs_the_csrf_token(daphne):
    session, conversation = owner_with_conversation(daphne, "csrf")
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    image = Part.objects.create(message=reply, index=1, kind="image", state="succeeded")
    routes = [
        ("/c/new/turns", {"text": " "}),
        (f"/c/{conversation.pk}/turns", {"text": " "}),
        (f"/c/{conversation.pk}/rename", {"title": " "}),
        (f"/c/{conversation.pk}/settings", {"temperature": 9}),
        (f"/m/{reply.pk}/regenerate", None),
        (f"/m/{reply.pk}/version", {"version": 1}),
        (f"/m/{reply.pk}/stop", None),
        (f"/parts/{image.pk}/retry", None),
        (f"/c/{conversation.pk}/delete", None),
        ("/accounts/logout/", None),
    ]
    forged = {"Referer": daphne.url, "Origin": daphne.url}
    for path, body in routes:
        without = session.post(daphne.url + path, json=body, allow_redirects=False, timeout=30)
        assert without.status_code == 403, path
        wrong = session.post(
            daphne.url + path,
            json=body,
            headers={**forged, "X-CSRFToken": "x" * 32},
            allow_redirects=False,
            timeout=30,
        )
        assert wrong.status_code == 403, path
    cross_site = session.post(
        daphne.url + routes[0][0],
        headers={"X-CSRFToken": session.cookies["csrftoken"], "Origin": "http://evil.example"},
        allow_redirects=False,
        timeout=30,
    )
    assert cross_site.status_code == 403
    accepted = Counter()
    for path, body in routes[1:-1]:
        answer = session.post(
            daphne.url + path,
            json=body,
            headers={**forged, "X-CSRFToken": session.cookies["csrftoken"]},
            allow_redirects=False,
            timeout=30,
        )
        accepted[answer.status_code] += 1
        assert answer.status_code != 403, path
    print(
        f"\ncsrf: {len(routes)} POST routes x 2 forgeries + 1 cross-site origin = "
        f"{2 * len(routes) + 1} refused (403); with the token: {dict(accepted)}"
    )


def test_the_socket_refuses_foreign_origins(daphne):
    session, conversation = owner_with_conversation(daphne, "origin")
    url = f"{daphne.ws_url}/ws/conversations/{conversation.pk}/"
    cookie = f"sessionid={session.cookies['sessionid']}"
    assert first_frame(url, cookie, daphne.url)["type"] == "snapshot"
    foreign = [
        "http://evil.example",
        "http://127.0.0.1.evil.example",
        "https://evil.example:443",
        "null",
        "file://",
        "http://localhost.evil.example:8000",
    ]
    refused = [origin for origin in foreign if first_frame(url, cookie, origin) == "http 403"]
    print(f"\nwebsocket origin: {len(refused)}/{len(foreign)} foreign origins refused (403)")
    assert refused == foreign


def test_the_socket_refuses_a_missing_origin(daphne):
    session, conversation = owner_with_conversation(daphne, "noorigin")
    url = f"{daphne.ws_url}/ws/conversations/{conversation.pk}/"
    headers = {"Cookie": f"sessionid={session.cookies['sessionid']}"}
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers=headers, open_timeout=10)
    assert refused.value.response.status_code == 403
