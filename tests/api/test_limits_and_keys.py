"""A Daphne with one slot, one waiting place and API keys: 429s, 401s and no orphans."""

import pytest

from tests.conftest import serving
from tests.support.http import get, open_long_stream, post_json, scrape_metric
from tests.support.processes import wait_until

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tight_server(django_db_setup, service_logs):
    with serving(
        "daphne-tight",
        service_logs,
        TANDEM_MAX_RUNNING="1",
        TANDEM_MAX_WAITING="1",
        TANDEM_API_KEYS=f"other-key,{KEY}",
    ) as server:
        yield server


def hold_stream(server):
    """Open a long stream and keep it open (it occupies a slot or the waiting place)."""
    return open_long_stream(server, "Tell me about rivers.", AUTH)


def test_missing_or_wrong_key_is_401(tight_server):
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}
    status, headers, answer = post_json(f"{tight_server.url}/generate", body)
    assert status == 401 and answer["error_type"] == "authentication"
    assert headers["WWW-Authenticate"].startswith("Bearer")
    status, _, _ = post_json(f"{tight_server.url}/generate", body, {"Authorization": "Bearer no"})
    assert status == 401
    status, _, answer = get(f"{tight_server.url}/v1/models")
    assert status == 401 and answer["error"]["type"] == "authentication_error"
    assert post_json(f"{tight_server.url}/generate", body, AUTH)[0] == 200


def test_full_queue_is_429_with_retry_after_and_leaves_no_orphans(tight_server):
    running = hold_stream(tight_server)
    assert running.getresponse().status == 200
    wait_until(
        lambda: scrape_metric(tight_server, "tandem_engine_running_requests") == 1, 10, "running"
    )
    waiting = hold_stream(tight_server)
    wait_until(
        lambda: scrape_metric(tight_server, "tandem_engine_waiting_requests") == 1, 10, "waiting"
    )

    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}
    status, headers, answer = post_json(f"{tight_server.url}/generate", body, AUTH)
    assert status == 429
    assert answer["error_type"] == "overloaded"
    assert int(headers["Retry-After"]) >= 1
    status, _, answer = post_json(
        f"{tight_server.url}/v1/completions", {"model": "m", "prompt": "Hi"}, AUTH
    )
    assert status == 429 and answer["error"]["type"] == "rate_limit_exceeded"

    running.close()
    waiting.close()
    wait_until(
        lambda: (
            scrape_metric(tight_server, "tandem_engine_running_requests") == 0
            and scrape_metric(tight_server, "tandem_engine_waiting_requests") == 0
        ),
        15,
        "the engine to drop both held requests",
    )
    assert post_json(f"{tight_server.url}/generate", body, AUTH)[0] == 200
