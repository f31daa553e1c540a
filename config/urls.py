"""Top-level routes: the whole project, or (TANDEM_ROLE=engine) only the engine's."""

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib import admin
from django.http import Http404
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from chat.views import home
from inference.api.tgi import compat_generate
from ops import health

home_async = sync_to_async(home)


@csrf_exempt
async def root(request):
    """GET / is the chat; POST / is TGI's root route, where its client sends requests.

    CSRF does not apply: POST here is the bearer-key API, never a cookie-authenticated form.
    """
    if request.method == "POST":
        return await compat_generate(request)
    return await home_async(request)


@csrf_exempt
async def engine_root(request):
    """An engine-only process: POST / is TGI's route; there is no chat page to GET."""
    if request.method == "POST":
        return await compat_generate(request)
    raise Http404("This process serves only the engine (TANDEM_ROLE=engine).")


# An engine-only process (one engine box behind many web processes, docs/deploy.md): the
# generation APIs, /metrics and /health; the chat, its accounts and the admin are 404.
engine_urlpatterns = [
    path("", engine_root, name="home"),
    path("", include("inference.api.urls")),
    path("health", health.health, name="health"),
]

urlpatterns = (
    engine_urlpatterns
    if settings.TANDEM_ROLE == "engine"
    else [
        path("", root, name="home"),
        path("", include("chat.urls")),
        path("", include("inference.api.urls")),
        path("accounts/", include("django.contrib.auth.urls")),
        path("admin/", admin.site.urls),
        path("", include("ops.urls")),
    ]
)
