"""Before the model is ready the API answers 503 with a reason, never a 500."""

import pytest

from tests.support.http import metric_values

pytestmark = pytest.mark.django_db

REJECTED = "tandem_engine_requests_rejected_total"


def test_generate_is_503_while_no_model_is_loaded(client):
    response = client.post("/generate", {"inputs": "Hi"}, content_type="application/json")
    assert response.status_code == 503
    assert response.json()["error_type"] == "unavailable"
    assert "loading" in response.json()["error"] or "no model" in response.json()["error"]


def test_openai_is_503_in_its_own_shape(client):
    response = client.post(
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
        content_type="application/json",
    )
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"


def test_metrics_are_served_without_an_engine(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"tandem_engine_running_requests 0.0" in response.content


def test_a_refusal_is_counted_once_where_it_is_rendered(client):
    """Invalid bodies count as rejected by the endpoint; a 503 for no model does not."""

    def rejected() -> float:
        text = client.get("/metrics").content.decode()
        return metric_values(text, REJECTED).get(f'{REJECTED}{{reason="validation"}}', 0.0)

    before = rejected()
    invalid = {"inputs": "Hi", "parameters": {"top_p": 2}}
    response = client.post("/generate", invalid, content_type="application/json")
    assert response.status_code == 422
    assert rejected() == before + 1
    client.post("/generate", {"inputs": "Hi"}, content_type="application/json")
    assert rejected() == before + 1
