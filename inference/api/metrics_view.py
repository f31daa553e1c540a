"""GET /metrics in Prometheus's text format."""

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Everything registered with prometheus_client's default registry (the apps' ready())."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
