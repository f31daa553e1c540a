"""ASGI entry point: Django for HTTP, Channels consumers for WebSocket.

The model starts loading in a background thread here, in the web process only, so that
management commands and Celery workers never pay for it; the process also starts beating
its heartbeat, which the sweeper reads to find text parts of a web process that died.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from chat import heartbeat  # noqa: E402
from chat.routing import websocket_urlpatterns  # noqa: E402
from config.request_id import RequestIdASGIMiddleware  # noqa: E402
from inference.provisioning import runtime, startup  # noqa: E402

runtime.start_background_load(startup.start_engine)
heartbeat.start()

application = ProtocolTypeRouter(
    {
        "http": RequestIdASGIMiddleware(django_asgi_app),
        "websocket": RequestIdASGIMiddleware(
            AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)
