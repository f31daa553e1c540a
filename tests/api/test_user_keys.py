"""Users' API keys over HTTP on real Daphnes that serve no model (TANDEM_LOAD_MODEL=0).

The key is checked before the engine, so an accepted key gets the engine's 503 and a refused
one a 401 (or the cap's 429): the status alone says which door the request went through.
"""

from __future__ import annotations

import hashlib
import io
import re
import uuid

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import override_settings

from chat import heartbeat, services
from chat.models import Conversation, Message, Part
from inference.api.keys import ApiKey, ApiRequest, key_create, key_revoke
from tests.chat.test_sse import signed_in
from tests.conftest import start_daphne
from tests.support.http import get, post_json

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
TOKEN_ON_PAGE = re.compile(r'id="new-key-token">(tdm_[A-Za-z0-9_-]+)<')
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "x7$k2!pq9-tandem-production-like-secret-key-for-the-key-tests-0123456789",
    "ALLOWED_HOSTS": "127.0.0.1",
    "SECURE_SSL_REDIRECT": "0",
    "TANDEM_LOAD_MODEL": "0",
}


@pytest.fixture(scope="module")
def server(django_db_setup, service_logs):
    """Development settings (DEBUG=1), no service keys, a cap of 2 replies in flight."""
    daphne = start_daphne(
        "daphne-user-keys", service_logs, TANDEM_LOAD_MODEL="0", TANDEM_MAX_TURNS_IN_FLIGHT="2"
    )
    try:
        yield daphne
    finally:
        daphne.service.stop()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def models_status(server, headers: dict) -> int:
    return get(f"{server.url}/v1/models", headers)[0]


def create_on_page(server, session, name: str) -> str:
    """POST the page's form as the browser does; the token is read off the answer."""
    response = session.post(
        f"{server.url}/keys/",
        data={"name": name, "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert "no-store" in response.headers["Cache-Control"]
    return TOKEN_ON_PAGE.search(response.text).group(1)


def revoke_on_page(server, session, key_id: int):
    return session.post(
        f"{server.url}/keys/{key_id}/revoke",
        data={"csrfmiddlewaretoken": session.cookies["csrftoken"]},
        allow_redirects=False,
        timeout=30,
    )


def user(name: str):
    return get_user_model().objects.create_user(f"{name}-{uuid.uuid4().hex[:6]}")


def in_flight_chat_reply(owner) -> Part:
    """A chat reply being written, as a turn leaves it: an assistant message, a queued part."""
    conversation = Conversation.objects.create(owner=owner)
    reply = Message.objects.create(conversation=conversation, role="assistant", position=1)
    return Part.objects.create(message=reply, index=0, kind="text", state="queued")


def test_development_api_is_open_until_a_key_exists(server):
    assert models_status(server, {}) == 503
    assert models_status(server, bearer("anything")) == 503
    _, token = key_create(user("dev"), "first")
    assert models_status(server, {}) == 401
    assert models_status(server, bearer("anything")) == 401
    assert models_status(server, bearer(token)) == 503


def test_a_key_made_on_the_page_works_and_only_its_hash_is_stored(server):
    session = signed_in(server, f"hash-{uuid.uuid4().hex[:6]}")
    token = create_on_page(server, session, "my script")
    key = ApiKey.objects.get(name="my script")
    assert key.hashed == hashlib.sha256(token.encode()).hexdigest()
    assert key.prefix == token[:12] and token.startswith("tdm_") and len(token) > 40
    secret = token[12:]
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)  # every table: keys, requests, sessions, messages
    assert key.hashed in dump.getvalue()  # the dump does hold the key's row
    assert secret not in dump.getvalue() and token not in dump.getvalue()

    again = session.get(f"{server.url}/keys/", timeout=30).text
    assert secret not in again and key.prefix in again and "never" in again

    assert models_status(server, bearer(token)) == 503
    key.refresh_from_db()
    assert key.last_used_at is not None
    record = ApiRequest.objects.get(key=key)
    assert (record.owner_id, record.route, record.status) == (key.owner_id, "/v1/models", 503)
    assert record.finished_at is not None


def test_missing_and_wrong_keys_are_401_in_each_format(server):
    _, token = key_create(user("wrong"), "real")
    wrong = {
        "no header": {},
        "unknown key": bearer("tdm_" + uuid.uuid4().hex),
        "real prefix, wrong secret": bearer(token[:12] + "A" * (len(token) - 12)),
        "last character changed": bearer(token[:-1] + ("A" if token[-1] != "A" else "B")),
        "key plus suffix": bearer(token + "x"),
        "key as basic auth": {"Authorization": f"Basic {token}"},
        "key in another header": {"X-Api-Key": token},
    }
    for what, headers in wrong.items():
        status, answer_headers, answer = post_json(
            f"{server.url}/v1/chat/completions", CHAT, headers
        )
        assert status == 401, what
        assert answer["error"]["type"] == "authentication_error"
        assert answer_headers["WWW-Authenticate"].startswith("Bearer")
        status, _, answer = post_json(f"{server.url}/generate", {"inputs": "Hi"}, headers)
        assert (status, answer["error_type"]) == (401, "authentication"), what
    assert post_json(f"{server.url}/v1/chat/completions", CHAT, bearer(token))[0] == 503
    assert post_json(f"{server.url}/generate", {"inputs": "Hi"}, bearer(token))[0] == 503


def test_a_revoked_key_is_401_and_only_its_owner_can_revoke_it(server):
    alice = signed_in(server, f"alice-{uuid.uuid4().hex[:6]}")
    bob = signed_in(server, f"bob-{uuid.uuid4().hex[:6]}")
    token = create_on_page(server, alice, "to revoke")
    key = ApiKey.objects.get(name="to revoke")

    assert revoke_on_page(server, bob, key.pk).status_code == 404
    assert models_status(server, bearer(token)) == 503
    forged = alice.post(f"{server.url}/keys/{key.pk}/revoke", allow_redirects=False, timeout=30)
    assert forged.status_code == 403  # no CSRF token
    assert models_status(server, bearer(token)) == 503

    assert revoke_on_page(server, alice, key.pk).status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert models_status(server, bearer(token)) == 401
    assert (
        post_json(f"{server.url}/v1/completions", {"model": "m", "prompt": "Hi"}, bearer(token))[0]
        == 401
    )
    page = alice.get(f"{server.url}/keys/", timeout=30).text
    assert "revoked" in page and f"/keys/{key.pk}/revoke" not in page


def live_process() -> str:
    """The heartbeat id of the running Daphne, as an API request it serves records it."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    names = [name.decode() for name in client.scan_iter(f"{heartbeat.KEY_PREFIX}*")]
    assert names, "the server beats its heartbeat"
    return names[0][len(heartbeat.KEY_PREFIX) :]


def test_a_key_of_an_owner_over_the_cap_is_429_and_other_users_are_unaffected(server):
    alice, bob = user("alice"), user("bob")
    _, alice_token = key_create(alice, "alice's")
    _, bob_token = key_create(bob, "bob's")
    first, _ = in_flight_chat_reply(alice), in_flight_chat_reply(alice)

    status, headers, answer = post_json(
        f"{server.url}/v1/chat/completions", CHAT, bearer(alice_token)
    )
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert answer["error"]["type"] == "rate_limit_exceeded"
    assert "2 replies in progress" in answer["error"]["message"]
    status, _, answer = post_json(f"{server.url}/generate", {"inputs": "Hi"}, bearer(alice_token))
    assert (status, answer["error_type"]) == (429, "rate_limited")
    assert models_status(server, bearer(bob_token)) == 503
    assert not ApiRequest.objects.filter(owner=alice).exists()  # refused before any record

    Part.objects.filter(pk=first.pk).update(state="succeeded")
    assert models_status(server, bearer(alice_token)) == 503

    # A request left unfinished by a process that died does not hold the cap...
    ApiRequest.objects.create(owner=alice, route="/generate", process="gone:1:deadbeef")
    assert models_status(server, bearer(alice_token)) == 503
    # ...one a live process is serving does, for the API and for the chat alike.
    ApiRequest.objects.create(owner=alice, route="/generate", process=live_process())
    assert models_status(server, bearer(alice_token)) == 429
    with (
        override_settings(TANDEM_MAX_TURNS_IN_FLIGHT=2),  # the server's cap, in this process
        pytest.raises(services.TurnRefused) as refused,
    ):
        services.check_capacity(alice, None)
    assert refused.value.status == 429
    assert models_status(server, bearer(bob_token)) == 503


def test_production_refuses_without_a_key_unless_the_api_is_declared_open(
    django_db_setup, service_logs
):
    assert not ApiKey.objects.exists()  # no key of any kind: no user key, no TANDEM_API_KEYS
    closed = start_daphne("daphne-production-closed", service_logs, **PRODUCTION)
    try:
        for headers in ({}, bearer("anything")):
            assert models_status(closed, headers) == 401
            assert post_json(f"{closed.url}/generate", {"inputs": "Hi"}, headers)[0] == 401
            assert post_json(f"{closed.url}/", {"inputs": "Hi"}, headers)[0] == 401
        key, token = key_create(user("prod"), "prod")
        assert models_status(closed, bearer(token)) == 503
    finally:
        closed.service.stop()

    _, revoked = key_create(key.owner, "revoked")
    key_revoke(ApiKey.objects.get(name="revoked"))
    opened = start_daphne("daphne-production-open", service_logs, **PRODUCTION, TANDEM_API_OPEN="1")
    try:
        assert models_status(opened, {}) == 503
        assert models_status(opened, bearer("anything")) == 503
        assert models_status(opened, bearer(token)) == 503
        assert models_status(opened, bearer(revoked)) == 401  # told, not served anonymously
    finally:
        opened.service.stop()
