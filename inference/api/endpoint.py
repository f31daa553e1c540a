"""The one decorator every generation-API view wears, whatever its wire format."""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from inference.api.auth import require_api_key
from inference.api.errors import ApiError
from inference.provisioning.metrics import REJECTED


def api_endpoint(
    render_error: Callable[[ApiError], HttpResponse], auth_body: Callable[[str], dict]
):
    """No CSRF (bearer keys instead), the API key check, and ApiError → the format's error.

    Rendering the error is where a refusal before admission is counted, once per response.
    """

    def decorate(view):
        @functools.wraps(view)
        async def wrapped(request: HttpRequest) -> HttpResponse:
            try:
                return await view(request)
            except ApiError as error:
                if error.rejected:
                    REJECTED.labels(reason=error.error_type).inc()
                return render_error(error)

        return csrf_exempt(require_api_key(auth_body)(wrapped))

    return decorate
