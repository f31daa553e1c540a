"""Observability fixtures: the test database's turns and media queue, /metrics read as numbers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.chat.conftest import alice, conversation, engine_in_process, real_engine  # noqa: F401
from tests.media.conftest import empty_media_queue, media_root  # noqa: F401
from tests.support.http import metric_values


@pytest.fixture
def scrape(client) -> Callable[[str], dict[str, float]]:
    """GET /metrics through Django and return one family's samples, keyed by sample name."""

    def read(name: str) -> dict[str, float]:
        response = client.get("/metrics")
        assert response.status_code == 200
        return metric_values(response.content.decode(), name)

    return read
