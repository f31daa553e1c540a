"""The staff-only operations page and the JSON feed its script polls; thin over ops/snapshot.py."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from chat.models import Message
from ops.chart import status_chart
from ops.snapshot import STATUSES, ops_snapshot

REFRESH_MS = 5000


def panels_context(snapshot: dict[str, Any]) -> dict[str, Any]:
    totals = snapshot["messages"]["totals"]
    return {
        "ops": snapshot,
        "totals": [
            {"status": status, "label": Message.Status(status).label.lower(), "count": count}
            for status, count in totals.items()
        ],
        "chart": status_chart(snapshot["messages"]["buckets"], STATUSES),
    }


@never_cache
@staff_member_required
@require_GET
def ops_page(request: HttpRequest) -> HttpResponse:
    """Rendered whole on the server (it works without JS); static/js/ops.js then refreshes it."""
    context = panels_context(ops_snapshot())
    return render(request, "ops/index.html", {**context, "refresh_ms": REFRESH_MS})


@never_cache
@require_GET
def ops_status(request: HttpRequest) -> JsonResponse:
    """The same snapshot as JSON, plus the panels' HTML for the page to swap in.

    A feed has no login page to redirect to: anyone but active staff gets a bare 403.
    """
    if not (request.user.is_active and request.user.is_staff):
        return JsonResponse({"error": "Staff only."}, status=403)
    snapshot = ops_snapshot()
    html = render_to_string("ops/_panels.html", panels_context(snapshot), request=request)
    return JsonResponse({**snapshot, "html": html})
