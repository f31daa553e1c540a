"""Routes of the operations app: readiness, the staff page and its feed, CSP reports."""

from django.urls import path

from ops import csp_report, health, views

urlpatterns = [
    path("ops/", views.ops_page, name="ops"),
    path("ops/status.json", views.ops_status, name="ops-status"),
    path("health", health.health, name="health"),
    path("csp-report", csp_report.csp_report, name="csp-report"),
]
