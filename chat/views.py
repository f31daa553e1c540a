"""Chat page views; thin, the logic lives in services."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The signed-in landing page."""
    return render(request, "chat/home.html")
