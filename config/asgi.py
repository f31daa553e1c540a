"""ASGI entry point: Django for HTTP, Channels consumers for WebSocket.

The model starts loading in a background thread here, in the web process only, so that
management commands and Celery workers never pay for it (with TANDEM_ENGINE set to URLs the
runtime loads none and streams from those engines); the process also starts beating its
heartbeat, which the sweeper reads to find text parts of a web process that died, and the
per-user cap to leave out API requests of one (chat/caps.py). An engine-only process
(TANDEM_ROLE=engine) streams no text parts and serves no WebSocket.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from chat import heartbeat  # noqa: E402
from chat.direct import DirectWriters  # noqa: E402
from chat.routing import websocket_urlpatterns  # noqa: E402
from chat.socket_auth import session_auth_stack  # noqa: E402
from config.request_id import RequestIdASGIMiddleware  # noqa: E402
from inference.provisioning import runtime, startup  # noqa: E402

runtime.start_background_load(startup.start_engine)
heartbeat.start()
protocols = {"http": DirectWriters(RequestIdASGIMiddleware(django_asgi_app))}
if settings.TANDEM_ROLE == "all":
    protocols["websocket"] = DirectWriters(
        RequestIdASGIMiddleware(
            AllowedHostsOriginValidator(session_auth_stack(URLRouter(websocket_urlpatterns)))
        )
    )

application = ProtocolTypeRouter(protocols)
