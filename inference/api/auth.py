"""Optional bearer keys for the generation API (TANDEM_API_KEYS)."""

from __future__ import annotations

import functools
import hmac

from django.conf import settings
from django.http import HttpRequest, JsonResponse


def key_is_valid(request: HttpRequest) -> bool:
    """True when no keys are configured, or the Authorization header carries one of them."""
    keys = settings.TANDEM_API_KEYS
    if not keys:
        return True
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return any(hmac.compare_digest(token.strip().encode(), key.encode()) for key in keys)


def require_api_key(error_body):
    """Decorate an async view: 401 with `error_body(message)` unless the key is valid."""

    def decorate(view):
        @functools.wraps(view)
        async def wrapped(request: HttpRequest, *args, **kwargs):
            if not key_is_valid(request):
                response = JsonResponse(
                    error_body("A valid API key is required (Authorization: Bearer <key>)."),
                    status=401,
                )
                response["WWW-Authenticate"] = 'Bearer realm="tandem"'
                return response
            return await view(request, *args, **kwargs)

        return wrapped

    return decorate
