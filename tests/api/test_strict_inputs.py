"""Strict request bodies: no coercion of JSON types, and no silent clamp of the output length.

TGI refuses with 422 in `{"error", "error_type"}`, OpenAI with 400 in `{"error": {...}}`, as
the servers they copy do; the official `openai` client raises BadRequestError with the message.
"""

import openai
import pytest

from tests.support.http import post_json

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

FRANCE = "What is the capital of France?"
QUESTION = [{"role": "user", "content": FRANCE}]
CHAT = {"model": "m", "messages": QUESTION, "max_tokens": 2}


@pytest.mark.parametrize(
    "parameters, field",
    [
        ({"top_k": True}, "parameters.top_k"),
        ({"max_new_tokens": "2"}, "parameters.max_new_tokens"),
        ({"max_new_tokens": 2.0}, "parameters.max_new_tokens"),
        ({"temperature": "0.5"}, "parameters.temperature"),
        ({"temperature": False}, "parameters.temperature"),
        ({"do_sample": 1}, "parameters.do_sample"),
        ({"details": "true"}, "parameters.details"),
        ({"seed": True}, "parameters.seed"),
    ],
)
def test_tgi_refuses_coerced_types_with_422(engine_server, parameters, field):
    body = {"inputs": FRANCE, "parameters": {"max_new_tokens": 2, **parameters}}
    status, _, answer = post_json(f"{engine_server.url}/generate", body)
    assert status == 422, answer
    assert answer["error_type"] == "validation" and field in answer["error"]


def test_tgi_accepts_a_json_integer_for_a_float(engine_server):
    body = {"inputs": FRANCE, "parameters": {"max_new_tokens": 2, "temperature": 1, "seed": 1}}
    status, _, answer = post_json(f"{engine_server.url}/generate", body)
    assert status == 200, answer


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"top_k": True}, "top_k"),
        ({"max_tokens": "2"}, "max_tokens"),
        ({"temperature": True}, "temperature"),
        ({"stream": "false"}, "stream"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_openai_refuses_coerced_types_with_400(engine_server, extra, field):
    status, _, answer = post_json(f"{engine_server.url}/v1/chat/completions", {**CHAT, **extra})
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert field in answer["error"]["message"]


def test_openai_accepts_a_json_integer_for_a_float(engine_server):
    body = {**CHAT, "temperature": 0, "top_p": 1}
    status, _, answer = post_json(f"{engine_server.url}/v1/chat/completions", body)
    assert status == 200, answer


@pytest.mark.parametrize("route", ["/generate", "/generate_stream", "/"])
def test_tgi_max_new_tokens_beyond_the_context_is_422(engine_server, route):
    body = {"inputs": FRANCE, "parameters": {"max_new_tokens": 5000}}
    status, _, answer = post_json(f"{engine_server.url}{route}", body)
    assert status == 422, answer
    assert answer["error_type"] == "validation"
    assert "`inputs` tokens + `max_new_tokens` must be <= 2048" in answer["error"]


def test_tgi_batch_max_new_tokens_beyond_the_context_is_422(engine_server):
    body = {"prompts": [{"id": "a", "prompt": FRANCE}], "parameters": {"max_new_tokens": 5000}}
    status, _, answer = post_json(f"{engine_server.url}/generate", body)
    assert status == 422 and "max_new_tokens" in answer["error"], answer


def test_the_truncated_prompt_is_what_must_fit(engine_server):
    url = f"{engine_server.url}/generate"
    fits = {"inputs": "word " * 2500, "parameters": {"truncate": 2047, "max_new_tokens": 1}}
    status, _, answer = post_json(url, fits)
    assert status == 200, answer
    fits["parameters"]["max_new_tokens"] = 2
    status, _, answer = post_json(url, fits)
    assert status == 422 and "Given: 2047 `inputs` tokens" in answer["error"], answer


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_openai_client_sees_bad_request_beyond_the_context(engine_server, field):
    client = openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=QUESTION, **{field: 5000})
    assert refused.value.status_code == 400
    message = refused.value.body["message"]
    assert "maximum context length is 2048 tokens" in message and field in message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt=FRANCE, max_tokens=5000, stream=True)


def test_openai_max_tokens_that_fit_are_served(engine_server):
    status, _, answer = post_json(
        f"{engine_server.url}/v1/completions",
        {"model": "m", "prompt": FRANCE, "max_tokens": 1, "temperature": 0},
    )
    assert status == 200 and answer["usage"]["completion_tokens"] == 1, answer
