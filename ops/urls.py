"""Routes of the operations app: readiness for load balancers, the staff page and its feed."""

from django.urls import path

from ops import health, views

urlpatterns = [
    path("ops/", views.ops_page, name="ops"),
    path("ops/status.json", views.ops_status, name="ops-status"),
    path("health", health.health, name="health"),
]
