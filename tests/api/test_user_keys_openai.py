"""A user's key through the official `openai` client against a real Daphne with the model.

One reply in flight per user (TANDEM_MAX_TURNS_IN_FLIGHT=1): a stream held open with Alice's
key fills her cap, for the API and the chat alike, while Bob's key is served.
"""

from __future__ import annotations

import openai
import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

from chat import services
from inference.api.keys import ApiRequest, key_create, key_revoke
from tests.conftest import serving
from tests.support.http import get
from tests.support.processes import wait_until

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(django_db_setup, service_logs):
    with serving("daphne-user-keys-model", service_logs, TANDEM_MAX_TURNS_IN_FLIGHT="1") as daphne:
        yield daphne


def client(server, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0)


def user_with_key(name: str):
    owner = get_user_model().objects.create_user(name)
    key, token = key_create(owner, f"{name}'s laptop")
    return owner, key, token


def test_the_openai_client_with_a_users_key(server, admin_client):
    assert get(f"{server.url}/v1/models")[0] == 200  # development, no key yet: open
    alice, key, token = user_with_key("alice")
    with pytest.raises(openai.AuthenticationError):
        client(server, "sk-anything").models.list()

    reply = client(server, token).chat.completions.create(
        model="smollm2-135m-instruct", messages=QUESTION, temperature=0, max_tokens=20
    )
    assert "Paris" in reply.choices[0].message.content
    record = ApiRequest.objects.get(key=key)
    assert (record.owner, record.route, record.status) == (alice, "/v1/chat/completions", 200)
    assert record.finished_at is not None

    page = admin_client.get("/admin/inference/apirequest/").content.decode()
    assert "alice&#x27;s laptop" in page and f"{key.prefix}…" in page

    key_revoke(key)
    with pytest.raises(openai.AuthenticationError):
        client(server, token).models.list()


def test_a_held_stream_fills_its_owners_cap_and_no_one_elses(server):
    alice, alice_key, alice_token = user_with_key("alice")
    _, _, bob_token = user_with_key("bob")
    stream = client(server, alice_token).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Tell me about rivers."}],
        temperature=0,
        max_tokens=1000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    try:
        next(iter(stream))  # the stream is admitted and running
        with pytest.raises(openai.RateLimitError) as refused:
            client(server, alice_token).completions.create(model="m", prompt="Hi", max_tokens=1)
        assert "1 replies in progress" in refused.value.message
        with (
            override_settings(TANDEM_MAX_TURNS_IN_FLIGHT=1),
            pytest.raises(services.TurnRefused) as turn,
        ):
            services.check_capacity(alice, None)  # the chat counts the API's stream too
        assert turn.value.status == 429
        other = client(server, bob_token).completions.create(model="m", prompt="Hi", max_tokens=1)
        assert other.usage.completion_tokens == 1
    finally:
        stream.close()

    def finished() -> bool:
        return not ApiRequest.objects.filter(key=alice_key, finished_at__isnull=True).exists()

    wait_until(finished, 15, "the closed stream's request to finish")
    again = client(server, alice_token).completions.create(model="m", prompt="Hi", max_tokens=1)
    assert again.usage.completion_tokens == 1
