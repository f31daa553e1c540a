"""The 503 a request gets when the database is unavailable (config/database_unavailable.py).

The outage itself is caused for real in tests/chaos/test_pg_outage.py; here, the mapping of
each kind of request to its answer, fast, with the exception Django raises.
"""

import json

import pytest
from django.db import InterfaceError, OperationalError
from django.test import RequestFactory

from config.database_unavailable import MESSAGE, DatabaseUnavailableMiddleware

middleware = DatabaseUnavailableMiddleware(lambda request: None)


@pytest.mark.parametrize("error", [OperationalError("gone"), InterfaceError("closed")])
def test_a_turn_gets_json_with_the_reason_and_retry_after(error):
    request = RequestFactory().post("/c/1/turns", "{}", content_type="application/json")
    response = middleware.process_exception(request, error)
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert json.loads(response.content) == {"error": MESSAGE}


def test_a_page_gets_a_page_that_says_so():
    request = RequestFactory().get("/c/1/", HTTP_ACCEPT="text/html")
    response = middleware.process_exception(request, OperationalError("gone"))
    assert response.status_code == 503 and response["Content-Type"].startswith("text/html")
    assert MESSAGE in response.content.decode()


def test_other_errors_are_left_to_django():
    request = RequestFactory().get("/c/1/")
    assert middleware.process_exception(request, ValueError("a bug")) is None
