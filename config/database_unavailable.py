"""A request that finds the database unavailable gets a clear 503, not a 500 traceback.

Django raises OperationalError (the server is down or refused the connection; while it is
down, the gate of `config.postgres` refuses at once) or InterfaceError (a connection that died
under the request). Either is answered with 503 and `Retry-After`: JSON `{"error": ...}` for a
request that sends or asks for JSON (the page's turn, stop and retry calls show the error as
their notice), otherwise a short page that says so. The page is rendered without the request,
so that it needs no session, user or other database read. The API routes touch the
database only for a user's key (`inference/api/keys.py`): with a service key or none they keep
answering through an outage.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.utils.deprecation import MiddlewareMixin

log = logging.getLogger(__name__)
RETRY_AFTER = 5
MESSAGE = "The database is unavailable right now; try again in a few seconds."


def wants_json(request: HttpRequest) -> bool:
    accept = request.headers.get("Accept", "")
    sends = request.headers.get("Content-Type", "")
    return "application/json" in accept or "application/json" in sends or request.method != "GET"


def unavailable_response(request: HttpRequest) -> HttpResponse:
    if wants_json(request):
        response = JsonResponse({"error": MESSAGE}, status=503)
    else:
        page = render_to_string("database_unavailable.html", {"message": MESSAGE})
        response = HttpResponse(page, status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """Maps a view's OperationalError or InterfaceError to the 503 above (sync and async)."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        log.warning("%s %s: database unavailable (%s)", request.method, request.path, exception)
        return unavailable_response(request)
