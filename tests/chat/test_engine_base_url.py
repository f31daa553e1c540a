"""TANDEM_ENGINE takes a base URL with or without `/v1`: llama-server documents
`http://host:8080/v1`, and before `remote_engine.base_url` that URL asked for `/v1/v1/models`
(404: /health said the engine was down) and every reply ended "refused this reply (404)".

Against a real OpenAI-compatible server in its own process (`bench/openai_stub.py`), which
answers only the `/v1/...` paths and 404 to anything else."""

from __future__ import annotations

import sys
import threading

import pytest

from inference.engine.sampling import SamplingParams
from inference.provisioning.remote_engine import RemoteEngine, base_url
from tests.support.processes import Service, child_env, free_port, port_open, wait_until


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("http://127.0.0.1:18080", "http://127.0.0.1:18080"),
        ("http://127.0.0.1:18080/", "http://127.0.0.1:18080"),
        ("http://127.0.0.1:18080/v1", "http://127.0.0.1:18080"),
        ("http://127.0.0.1:18080/v1/", "http://127.0.0.1:18080"),
        (" https://gpu.example/openai/v1 ", "https://gpu.example/openai"),
        ("http://127.0.0.1:18080/v1beta", "http://127.0.0.1:18080/v1beta"),
    ],
)
def test_a_trailing_v1_or_slash_is_dropped_once(given, base):
    assert base_url(given) == base


@pytest.fixture(scope="module")
def stub_engine(service_logs):
    port = free_port()
    argv = [sys.executable, "-m", "bench.openai_stub", "--port", str(port), "--rate", "200"]
    stub = Service(f"openai-stub-{port}", argv, child_env(), service_logs)
    try:
        wait_until(lambda: port_open(port) or not stub.alive(), 30, "the stub engine")
        yield f"http://127.0.0.1:{port}"
    finally:
        stub.stop()


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_an_engine_given_with_or_without_v1_is_reachable_and_streams(stub_engine, suffix):
    engine = RemoteEngine([stub_engine + suffix])
    try:
        [state] = engine.probe(timeout=5)
        assert (state["url"], state["reachable"], state["last_error"]) == (stub_engine, True, "")
        events, done = [], threading.Event()

        def on_event(event) -> None:
            events.append(event)
            if event.is_finished:
                done.set()

        params = SamplingParams(max_new_tokens=5, temperature=0.0)
        engine.submit([{"role": "user", "content": "hi"}], params, on_event, "base-url-test")
        assert done.wait(10), events
    finally:
        engine.close()
    final = events[-1]
    assert final.error is None and final.finish_reason.value == "length", final
    assert len(events) == 6 and final.full_text == "".join(e.text for e in events)
