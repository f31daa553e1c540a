"""A request_id for every HTTP request and WebSocket connection, on each line they log.

The caller's X-Request-ID (a proxy's, a load balancer's) is kept when it is sane, so its
logs and ours join up; otherwise a new id is made. HTTP responses echo it in X-Request-ID.
"""

from __future__ import annotations

import logging
import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from config.logging import bound, current, request_id_from

log = logging.getLogger("tandem.request")
HEADER = "X-Request-ID"


class RequestIdMiddleware:
    """Binds the request's id around the request and logs one line when it is answered.

    Under ASGI the id is already bound by `RequestIdASGIMiddleware` (so that lines Django
    logs outside the middleware chain, such as its 4xx/5xx warnings, carry it too) and is
    reused here; under WSGI or Django's test client it is made here.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self._acall(request)
        request_id, started = request_id_of(request), time.monotonic()
        with bound(request_id=request_id):
            response = self.get_response(request)
            answered(request, response, request_id, started)
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        request_id, started = request_id_of(request), time.monotonic()
        with bound(request_id=request_id):
            response = await self.get_response(request)
            answered(request, response, request_id, started)
        return response


def request_id_of(request: HttpRequest) -> str:
    """The id the ASGI layer bound for this request, else one from the caller's header."""
    return str(current().get("request_id") or request_id_from(request.headers.get(HEADER)))


def answered(request: HttpRequest, response: HttpResponse, request_id: str, started: float):
    """Echo the id to the caller and log the request's one access line."""
    response[HEADER] = request_id
    log.info(
        "%s %s %s",
        request.method,
        request.path,
        response.status_code,
        extra={
            "request_id": request_id,
            "status": response.status_code,
            "duration_ms": round((time.monotonic() - started) * 1e3, 1),
        },
    )


class RequestIdASGIMiddleware:
    """ASGI middleware: one request_id per HTTP request or WebSocket connection.

    Django's handler and a WebSocket consumer run in the task this call awaits (or in tasks
    and threads started from it, which copy the context), so the id is bound for everything
    that request or connection logs, and for nothing else.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        caller = headers.get(HEADER.lower().encode(), b"").decode("latin-1")
        with bound(request_id=request_id_from(caller)):
            return await self.app(scope, receive, send)
