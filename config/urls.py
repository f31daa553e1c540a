"""Top-level routes."""

from asgiref.sync import sync_to_async
from django.contrib import admin
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from chat.views import home
from inference.api.tgi import compat_generate

home_async = sync_to_async(home)


@csrf_exempt
async def root(request):
    """GET / is the chat; POST / is TGI's root route, where its client sends requests.

    CSRF does not apply: POST here is the bearer-key API, never a cookie-authenticated form.
    """
    if request.method == "POST":
        return await compat_generate(request)
    return await home_async(request)


urlpatterns = [
    path("", root, name="home"),
    path("", include("chat.urls")),
    path("", include("inference.api.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path("", include("ops.urls")),
]
