"""Who is calling the generation API: a service key, a user's key, or nobody.

Service keys (TANDEM_API_KEYS) are shared secrets in the settings, for other Tandem processes
and benchmarks; user keys are rows (`inference/api/keys.py`) and make the request count
against their owner's cap. Without a valid key the API answers 401, unless it is open:
TANDEM_API_OPEN=1, or in development (DEBUG) while no key of any kind exists.
"""

from __future__ import annotations

import contextlib
import hmac
from dataclasses import dataclass

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse

from inference.api import keys


@dataclass(frozen=True)
class Caller:
    """An admitted caller; `key` is the user key it used (None: a service key or open API)."""

    key: keys.ApiKey | None = None


def bearer_token(request: HttpRequest) -> str:
    """The token of `Authorization: Bearer <token>`, or "" without one."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def is_service_key(token: str) -> bool:
    """Compared with every service key, each in constant time."""
    matches = [
        hmac.compare_digest(token.encode(), key.encode()) for key in settings.TANDEM_API_KEYS
    ]
    return any(matches)


def open_without_key() -> bool:
    """Whether a request without a valid key is served: only when said so, or in development
    before any key is configured, so production never serves an API nobody locked by mistake."""
    if settings.TANDEM_API_OPEN:
        return True
    if settings.TANDEM_API_KEYS or not settings.TANDEM_API_OPEN_IN_DEVELOPMENT:
        return False
    return not user_keys_exist()


_keys_seen = False  # what the database last said, for while it cannot say


def user_keys_exist() -> bool:
    """Whether some user holds a live key; while the database is unavailable, what it said
    last (a development server's API answers through an outage, as the API without user keys
    needs no database)."""
    global _keys_seen
    with contextlib.suppress(OperationalError, InterfaceError):
        _keys_seen = keys.any_live_key()
    return _keys_seen


def caller_of(request: HttpRequest) -> Caller | None:
    """The caller, or None when the request must be refused (runs queries: call it sync).

    A token that looks like a user key must be a live one even where the API is open, so a
    revoked key is told so instead of being served anonymously.
    """
    token = bearer_token(request)
    if token and is_service_key(token):
        return Caller()
    if token.startswith(keys.TOKEN_MARK):
        key = keys.key_for_token(token)
        return Caller(key) if key is not None else None
    return Caller() if open_without_key() else None


def unauthorized(error_body) -> JsonResponse:
    """401 in the route's error shape, with the challenge clients look for."""
    response = JsonResponse(
        error_body("A valid API key is required (Authorization: Bearer <key>)."), status=401
    )
    response["WWW-Authenticate"] = 'Bearer realm="tandem"'
    return response
