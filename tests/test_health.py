"""GET /health reports db, redis and model, and answers 503 until all are usable."""

import json
import time
import urllib.error
import urllib.request

import pytest
from django.test import override_settings

from tests.support.processes import free_port


def fetch(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.django_db
def test_health_is_503_while_the_model_is_not_loaded(client):
    response = client.get("/health")
    body = response.json()
    assert response.status_code == 503
    assert body["db"] == {"state": "ok"}
    assert body["redis"] == {"state": "ok"}
    assert body["model"]["state"] == "idle"  # this test process never starts loading


@pytest.mark.django_db
def test_health_reports_redis_down(client):
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"):
        body = client.get("/health").json()
    assert body["redis"]["state"] == "error"
    assert "ConnectionError" in body["redis"]["error"]
    assert body["status"] == "unavailable"


@pytest.mark.django_db(transaction=True)
def test_daphne_health_turns_ready_once_the_model_loads(daphne):
    seen = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status, body = fetch(f"{daphne.url}/health")
        seen.append(body["model"]["state"])
        assert status == (200 if body["model"]["state"] == "ready" else 503), body
        if status == 200:
            break
        assert body["model"]["state"] == "loading", body
        time.sleep(0.5)
    assert seen[-1] == "ready", seen
    assert body["status"] == "ok"
    assert body["model"]["name"] == "smollm2-135m-instruct"
    assert body["model"]["parameters"] == 134_515_008
