"""TGI's wire format on a real Daphne with the real SmolLM2: /generate, /generate_stream, POST /."""

import json

import pytest

from tests.support.http import post_json, sse_payloads

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

FRANCE = "The capital of France is"


def test_generate_greedy_with_details(engine_server):
    status, _, body = post_json(
        f"{engine_server.url}/generate",
        {"inputs": FRANCE, "parameters": {"max_new_tokens": 6, "details": True}},
    )
    assert status == 200, body
    assert body["generated_text"].startswith(" Paris")
    details = body["details"]
    assert details["finish_reason"] == "length"
    assert details["generated_tokens"] == 6 == len(details["tokens"])
    assert details["seed"] is None  # greedy
    assert "".join(token["text"] for token in details["tokens"]) == body["generated_text"]
    assert all(token["logprob"] <= 0 for token in details["tokens"])


def test_generate_without_details_and_with_full_text(engine_server):
    status, _, body = post_json(
        f"{engine_server.url}/generate",
        {"inputs": FRANCE, "parameters": {"max_new_tokens": 3, "return_full_text": True}},
    )
    assert status == 200
    assert set(body) == {"generated_text"}
    assert body["generated_text"].startswith(FRANCE + " Paris")


def test_generate_stream_sends_one_event_per_token(engine_server):
    status, headers, text = post_json(
        f"{engine_server.url}/generate_stream",
        {"inputs": FRANCE, "parameters": {"max_new_tokens": 5, "details": True}},
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = [json.loads(payload) for payload in sse_payloads(text)]
    assert [event["index"] for event in events] == [1, 2, 3, 4, 5]
    assert all(event["generated_text"] is None for event in events[:-1])
    assert all(event["details"] is None for event in events[:-1])
    final = events[-1]
    assert final["generated_text"] == "".join(event["token"]["text"] for event in events)
    assert final["details"] == {"finish_reason": "length", "generated_tokens": 5, "seed": None}
    assert set(final["token"]) == {"id", "text", "logprob", "special"}


def test_root_route_answers_a_list_or_a_stream(engine_server):
    body = {"inputs": FRANCE, "parameters": {"max_new_tokens": 2}, "stream": False}
    status, _, answer = post_json(f"{engine_server.url}/", body)
    assert status == 200
    assert isinstance(answer, list) and answer[0]["generated_text"].startswith(" Paris")
    status, _, text = post_json(f"{engine_server.url}/", {**body, "stream": True})
    assert len(sse_payloads(text)) == 2


def test_seeded_sampling_is_reproducible(engine_server):
    params = {
        "max_new_tokens": 8,
        "do_sample": True,
        "temperature": 0.9,
        "seed": 1234,
        "details": True,
    }
    first = post_json(f"{engine_server.url}/generate", {"inputs": "Once", "parameters": params})
    again = post_json(f"{engine_server.url}/generate", {"inputs": "Once", "parameters": params})
    assert first[2]["generated_text"] == again[2]["generated_text"]
    assert first[2]["details"]["seed"] == 1234


def test_stop_sequence_ends_the_text_before_it(engine_server):
    status, _, body = post_json(
        f"{engine_server.url}/generate",
        {"inputs": FRANCE, "parameters": {"max_new_tokens": 12, "stop": ["."], "details": True}},
    )
    assert status == 200
    assert body["generated_text"] == " Paris"
    assert body["details"]["finish_reason"] == "stop_sequence"


def test_lecture_batch_form_answers_by_request_id(engine_server):
    prompts = [{"request_id": "b-2", "prompt": "One, two,"}, {"id": "a-1", "prompt": FRANCE}]
    status, _, body = post_json(
        f"{engine_server.url}/generate",
        {"prompts": prompts, "parameters": {"max_new_tokens": 4}},
    )
    assert status == 200
    assert [answer["request_id"] for answer in body] == ["b-2", "a-1"]
    assert body[1]["generated_text"].startswith(" Paris")
    assert all(answer["finish_reason"] in {"length", "eos_token"} for answer in body)
    bare = post_json(f"{engine_server.url}/generate", [{"id": "x", "prompt": FRANCE}])
    assert bare[0] == 200 and bare[2][0]["request_id"] == "x"


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"inputs": FRANCE, "parameters": {"top_p": 2}}, "parameters.top_p"),
        ({"inputs": "", "parameters": {}}, "inputs"),
        ({"inputs": FRANCE, "parameters": {"watermark": True}}, "not supported"),
        ({"inputs": FRANCE, "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"parameters": {}}, "inputs"),
        ([{"id": "same", "prompt": "a"}, {"id": "same", "prompt": "b"}], "unique"),
    ],
)
def test_invalid_requests_get_422_with_a_reason(engine_server, body, fragment):
    status, _, answer = post_json(f"{engine_server.url}/generate", body)
    assert status == 422, answer
    assert answer["error_type"] == "validation"
    assert fragment in answer["error"]


def test_malformed_json_is_422(engine_server):
    status, _, answer = post_json(f"{engine_server.url}/generate_stream", b"{not json")
    assert status == 422
    assert "not valid JSON" in answer["error"]


def test_prompt_over_the_context_window_is_422_unless_truncated(engine_server):
    long_prompt = "word " * 2500  # > TANDEM_MAX_SEQ_LEN (2048) tokens
    status, _, answer = post_json(
        f"{engine_server.url}/generate", {"inputs": long_prompt, "parameters": {}}
    )
    assert status == 422
    assert "tokens" in answer["error"]
    status, _, answer = post_json(
        f"{engine_server.url}/generate",
        {"inputs": long_prompt, "parameters": {"truncate": 64, "max_new_tokens": 2}},
    )
    assert status == 200, answer


def test_get_is_not_allowed(engine_server):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{engine_server.url}/generate", timeout=10)
    assert refused.value.code == 405
