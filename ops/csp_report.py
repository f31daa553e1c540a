"""Where browsers post Content-Security-Policy violations: each one becomes a warning log line.

With TANDEM_CSP_REPORT_ONLY=1 this log is how an operator learns what the policy would block
before enforcing it; enforced, it shows blocked injections and a page that needs a new source.
"""

from __future__ import annotations

import json
import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

log = logging.getLogger(__name__)
MAX_REPORT_BYTES = 16_384
FIELDS = ("document-uri", "violated-directive", "effective-directive", "blocked-uri")


@csrf_exempt  # browsers post reports without cookies or tokens
@require_POST
def csp_report(request: HttpRequest) -> HttpResponse:
    """Log the report's main fields; anything unreadable or oversized is dropped with a 400."""
    if len(request.body) > MAX_REPORT_BYTES:
        return HttpResponse(status=400)
    try:
        report = json.loads(request.body).get("csp-report", {})
    except (ValueError, AttributeError):
        return HttpResponse(status=400)
    if not isinstance(report, dict):
        return HttpResponse(status=400)
    details = {field: str(report.get(field, ""))[:300] for field in FIELDS}
    log.warning("csp violation %s", json.dumps(details, sort_keys=True))
    return HttpResponse(status=204)
