"""Top-level routes."""

from django.contrib import admin
from django.urls import include, path

from config import health

urlpatterns = [
    path("", include("chat.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("health", health.health, name="health"),
]
