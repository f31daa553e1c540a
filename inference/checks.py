"""System checks of the generation API's settings."""

from __future__ import annotations

from django.conf import settings
from django.core import checks


def api_open_check(app_configs, **kwargs) -> list[checks.Warning]:
    """`check --deploy`: TANDEM_API_OPEN serves the engine to anyone who can reach it."""
    if not settings.TANDEM_API_OPEN:
        return []
    return [
        checks.Warning(
            "TANDEM_API_OPEN=1 serves the generation API without any key: anyone who reaches "
            "the server can use the engine, and no request counts against a user's cap.",
            hint="Unset TANDEM_API_OPEN; give callers a user key (/keys) or a service key "
            "(TANDEM_API_KEYS).",
            id="tandem.W001",
        )
    ]
