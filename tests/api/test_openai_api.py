"""OpenAI's wire format, exercised with the official `openai` client against a real Daphne."""

import json

import openai
import pytest

from tests.support.http import post_json, sse_payloads

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(engine_server):
    return openai.OpenAI(base_url=f"{engine_server.url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [model.id for model in models.data] == ["smollm2-135m-instruct"]


def test_chat_completion_uses_the_chat_template(client):
    reply = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=QUESTION, temperature=0, max_tokens=20
    )
    choice = reply.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens > 20  # the template wraps the question
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_stream_with_usage_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=QUESTION,
            temperature=0,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_ignore_eos_generates_max_tokens_past_the_answer(client):
    asked = dict(model="m", messages=QUESTION, temperature=0, max_tokens=24)
    short = client.chat.completions.create(**asked)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 24
    full = client.chat.completions.create(**asked, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 24


def test_stream_ends_with_done(engine_server):
    status, _, text = post_json(
        f"{engine_server.url}/v1/chat/completions",
        {"model": "m", "messages": QUESTION, "temperature": 0, "max_tokens": 3, "stream": True},
    )
    payloads = sse_payloads(text)
    assert status == 200
    assert payloads[-1] == "[DONE]"
    first = json.loads(payloads[0])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["role"] == "assistant"


def test_text_completion_and_its_stream(client):
    reply = client.completions.create(
        model="m", prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert reply.choices[0].text.startswith(" Paris")
    assert reply.choices[0].finish_reason == "length"
    pieces = list(
        client.completions.create(
            model="m", prompt="The capital of France is", max_tokens=4, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == reply.choices[0].text
    echoed = client.completions.create(
        model="m", prompt="The capital of France is", max_tokens=2, temperature=0, echo=True
    )
    assert echoed.choices[0].text.startswith("The capital of France is Paris")


def test_seeded_sampling_is_reproducible(client):
    def ask():
        return (
            client.chat.completions.create(
                model="m", messages=QUESTION, temperature=0.8, seed=7, max_tokens=12
            )
            .choices[0]
            .message.content
        )

    assert ask() == ask()


def test_bad_requests_are_400_in_openai_shape(client):
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model="m", messages=[], max_tokens=2)
    assert "messages" in str(empty.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=QUESTION, n=3)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=QUESTION, temperature=5)
