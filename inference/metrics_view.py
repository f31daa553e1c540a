"""GET /metrics in Prometheus's text format."""

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

import inference.metrics  # noqa: F401  (registers the engine's metrics)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Everything registered with prometheus_client's default registry."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
