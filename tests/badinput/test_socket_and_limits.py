"""Malformed WebSocket frames, oversized prompts and invalid parameters, on a real Daphne.

Each bad input must get a clear answer (an error event on the socket, a 4xx naming the problem
over HTTP) and leave the connection and the server usable: after every hostile frame the same
socket still answers a ping, and after the oversized requests the API still generates.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from django.contrib.auth import get_user_model
from websockets.sync.client import connect

from chat.models import Conversation
from tests.chat.test_sse import post_turn, signed_in
from tests.support.http import post_json

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

HOSTILE_FRAMES: list[str | bytes] = [
    "{not json",
    "",
    "null",
    "[1, 2, 3]",
    "42",
    '"ping"',
    '{"type": 5}',
    '{"type": "send", "text": "hi"}',
    '{"type": "ping", "extra": ' + "[" * 5000 + "]" * 5000 + "}",
    b"\x00\xff binary",
    "x" * 1_000_000,
    json.dumps({"type": "x" * 500_000}),
]


def signed_in_with_conversation(server, username: str):
    session = signed_in(server, username)
    owner = get_user_model().objects.get(username=username)
    return session, Conversation.objects.create(owner=owner)


def test_hostile_frames_get_error_events_and_the_socket_survives(engine_server):
    session, conversation = signed_in_with_conversation(engine_server, "frames-user")
    url = f"{engine_server.ws_url}/ws/conversations/{conversation.pk}/"
    headers = {"Cookie": f"sessionid={session.cookies['sessionid']}", "Origin": engine_server.url}
    answers = Counter()
    with connect(url, additional_headers=headers, max_size=None, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "snapshot"
        for frame in HOSTILE_FRAMES:
            ws.send(frame)
            answer = json.loads(ws.recv(timeout=30))
            answers[answer["type"]] += 1
            assert answer["type"] == "error" and answer["error"], (frame[:40], answer)
            ws.send('{"type": "ping"}')
            assert json.loads(ws.recv(timeout=30)) == {"type": "pong"}
    print(f"\nwebsocket: {len(HOSTILE_FRAMES)} hostile frames, answers {dict(answers)}, 0 drops")
    assert answers == {"error": len(HOSTILE_FRAMES)}


def test_chat_turns_refuse_oversized_and_malformed_input_clearly(engine_server, settings):
    session, conversation = signed_in_with_conversation(engine_server, "limits-user")
    limit = settings.TANDEM_MAX_MESSAGE_CHARS
    too_long = post_turn(engine_server, session, conversation.pk, "x" * (limit + 1))
    assert too_long.status_code == 422
    assert f"the limit is {limit:,}" in too_long.json()["error"]
    turns = f"{engine_server.url}/c/{conversation.pk}/turns"
    headers = {"X-CSRFToken": session.cookies["csrftoken"], "Referer": engine_server.url}
    for raw, status in [
        (b"{not json", 400),
        (b'{"text": 5}', 400),
        (b"[]", 400),
        (b'{"text": "   "}', 422),
    ]:
        response = session.post(turns, data=raw, headers=headers, timeout=30)
        assert response.status_code == status, raw
        assert response.json()["error"]
    assert not conversation.messages.exists()


# (route, body, expected status, words the error must contain)
API_CASES = [
    ("/generate", {"inputs": "word " * 5000}, 422, "prompt"),
    ("/generate", {"inputs": "x" * 100_001}, 422, "inputs"),
    ("/generate", {"inputs": "Hi", "parameters": {"top_p": 1.5}}, 422, "parameters.top_p"),
    ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 0}}, 422, "max_new_tokens"),
    ("/generate", {"inputs": "Hi", "parameters": {"temperature": -1}}, 422, "temperature"),
    ("/generate", {"inputs": "Hi", "parameters": {"best_of": 2}}, 422, "best_of"),
    ("/generate", {"inputs": "Hi", "parameters": {"stop": [""]}}, 422, "stop"),
    ("/generate", {"inputs": "Hi", "parameters": {"seed": 2**64}}, 422, "seed"),
    ("/generate", {"inputs": "Hi", "parameters": "fast"}, 422, "parameters"),
    ("/generate", b'{"inputs": "Hi"', 422, "JSON"),
    ("/generate", b"\xff\xfe", 422, "JSON"),
    ("/generate_stream", {"inputs": ""}, 422, "inputs"),
    ("/generate_stream", {"inputs": "word " * 5000}, 422, "prompt"),
    ("/v1/completions", {"model": "m", "prompt": "word " * 5000}, 400, "prompt"),
    ("/v1/completions", {"model": "m", "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"model": "m", "prompt": "Hi", "n": 2}, 400, "n"),
    ("/v1/chat/completions", {"model": "m", "messages": []}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "wizard", "content": "Hi"}]},
        400,
        "role",
    ),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "word " * 5000}]},
        400,
        "prompt",
    ),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": "Hi", "temperature": 9},
        400,
        "temperature",
    ),
]


def error_text(body) -> str:
    return body["error"]["message"] if isinstance(body.get("error"), dict) else body["error"]


def test_api_refuses_oversized_prompts_and_invalid_parameters_by_name(engine_server):
    statuses = Counter()
    for route, body, status, words in API_CASES:
        got, _, answer = post_json(f"{engine_server.url}{route}", body)
        statuses[got] += 1
        assert got == status, (route, str(body)[:80], answer)
        assert words.lower() in error_text(answer).lower(), (route, answer)
    too_big = post_json(f"{engine_server.url}/generate", {"inputs": "x" * 3_000_000})
    statuses[too_big[0]] += 1
    assert too_big[0] == 400  # above DATA_UPLOAD_MAX_MEMORY_SIZE, refused before parsing
    print(f"\napi: {len(API_CASES) + 1} invalid requests, statuses {dict(statuses)}, 5xx = 0")
    ok, _, answer = post_json(
        f"{engine_server.url}/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}
    )
    assert ok == 200 and "generated_text" in answer


# Found by hand while widening the fuzzer's boundaries: a temperature or penalty this small
# overflowed the logits to inf, softmax made NaN and /v1/completions answered 500.
OVERFLOWING = [
    {"temperature": 1e-300},
    {"temperature": 5e-324, "top_k": 3},
    {"temperature": 1e-300, "top_p": 0.5},
    {"repetition_penalty": 1e-300},
]


def test_overflowing_sampling_knobs_are_not_server_errors(engine_server):
    prompt = "The capital of France is"
    for knobs in OVERFLOWING:
        body = {"model": "m", "prompt": prompt, "max_tokens": 2, **knobs}
        status, _, answer = post_json(f"{engine_server.url}/v1/completions", body)
        assert status == 200, (knobs, answer)
        parameters = {"max_new_tokens": 2, "do_sample": True, **knobs}
        status, _, answer = post_json(
            f"{engine_server.url}/generate", {"inputs": prompt, "parameters": parameters}
        )
        assert status == 200, (knobs, answer)
        if "repetition_penalty" not in knobs:  # temperature -> 0 is greedy decoding
            assert answer["generated_text"].startswith(" Paris"), (knobs, answer)
