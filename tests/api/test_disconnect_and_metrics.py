"""A client that goes away stops using the engine; /metrics shows what happened."""

import time

import pytest

from tests.support.http import get, metric_values, open_long_stream, post_json, scrape_metric
from tests.support.processes import wait_until

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


def scrape(server) -> str:
    return get(f"{server.url}/metrics")[2]


def sample(text: str, name: str) -> float:
    return metric_values(text, name).get(name, 0.0)


def test_disconnect_cancels_the_request(engine_server):
    before = scrape(engine_server)
    cancelled = 'tandem_engine_requests_finished_total{reason="cancelled"}'
    conn = open_long_stream(engine_server, "Write a long essay about the sea.")
    response = conn.getresponse()
    assert response.status == 200
    received = 0
    while received < 3:
        line = response.fp.readline()
        assert line, "the stream ended before three tokens"
        received += line.startswith(b"data:")
    assert scrape_metric(engine_server, "tandem_engine_running_requests") == 1
    generated_at_close = scrape_metric(engine_server, "tandem_engine_generated_tokens_total")
    response.close()  # the socket stays open while the response holds it
    conn.close()
    closed_at = time.monotonic()

    wait_until(
        lambda: scrape_metric(engine_server, "tandem_engine_running_requests") == 0,
        10,
        "the engine to drop the request",
    )
    freed_after = time.monotonic() - closed_at
    after = scrape(engine_server)
    assert sample(after, cancelled) == sample(before, cancelled) + 1
    generated = sample(after, "tandem_engine_generated_tokens_total")
    generated_after_close = generated - generated_at_close
    print(
        f"cancelled {freed_after * 1000:.0f} ms after the disconnect; "
        f"{generated_after_close:.0f} tokens generated meanwhile"
    )
    assert generated_after_close <= 3  # a step or two in flight, not the 1000 it asked for
    assert sample(after, "tandem_engine_kv_cache_used_tokens") == 0


def test_metrics_expose_latency_histograms_and_gauges(engine_server):
    post_json(
        f"{engine_server.url}/generate", {"inputs": "Hello", "parameters": {"max_new_tokens": 3}}
    )
    text = scrape(engine_server)
    for family in (
        "tandem_engine_time_to_first_token_seconds_bucket",
        "tandem_engine_inter_token_latency_seconds_bucket",
        "tandem_engine_queue_time_seconds_bucket",
        "tandem_engine_request_duration_seconds_bucket",
        "tandem_engine_running_requests",
        "tandem_engine_waiting_requests",
        "tandem_engine_batch_size",
        "tandem_engine_kv_cache_usage_ratio",
        "tandem_engine_prompt_tokens_total",
        "tandem_engine_generated_tokens_total",
        "tandem_engine_requests_finished_total",
    ):
        assert family in text, family
    assert sample(text, "tandem_engine_time_to_first_token_seconds_count") >= 1
    assert sample(text, "tandem_engine_prompt_tokens_total") >= 1


def test_metrics_count_prompt_tokens_reused_from_the_kv_cache(engine_server):
    before = sample(scrape(engine_server), "tandem_engine_prompt_tokens_reused_total")
    for _ in range(2):
        post_json(
            f"{engine_server.url}/generate",
            {"inputs": "Tell me about the sea and the sky", "parameters": {"max_new_tokens": 2}},
        )
    assert sample(scrape(engine_server), "tandem_engine_prompt_tokens_reused_total") > before
