"""GET /health: database, Redis and model state; 503 until every one of them is usable.

With remote engines (TANDEM_ENGINE=URLs) the model is `remote` and each engine is probed now
(GET /v1/models, TANDEM_HEALTH_TIMEOUT): its reachability, last error and latency are shown,
but they do not make this process unready: it still serves every page, and a reply that no
engine takes fails with the reason.
"""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from inference.provisioning.runtime import model_runtime

MODEL_OK = {"ready", "disabled", "remote"}


def check_model() -> dict[str, object]:
    """The runtime's state; remote engines are probed first, so their states are current."""
    remote = model_runtime.remote
    if remote is not None:
        remote.probe(settings.TANDEM_HEALTH_TIMEOUT)
    return model_runtime.snapshot()


def check_database() -> dict[str, str]:
    """One round trip to the database."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means "down", reported, never raised
        return {"state": "error", "error": f"{type(exc).__name__}: {exc}"}
    return {"state": "ok"}


def check_redis() -> dict[str, str]:
    """PING the broker / channel-layer Redis with a short timeout."""
    timeout = settings.TANDEM_HEALTH_TIMEOUT
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return {"state": "error", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        client.close()
    return {"state": "ok"}


@never_cache
@require_GET
def health(request):
    """Readiness for load balancers and for people: every component with its state."""
    components = {"db": check_database(), "redis": check_redis(), "model": check_model()}
    ready = (
        components["db"]["state"] == "ok"
        and components["redis"]["state"] == "ok"
        and components["model"]["state"] in MODEL_OK
    )
    body = {"status": "ok" if ready else "unavailable", **components}
    return JsonResponse(body, status=200 if ready else 503)
