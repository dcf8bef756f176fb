"""ASGI entry point: Django for HTTP, Channels for the run WebSockets.

Two kinds of WebSocket, each with its own authentication:

* ``ws/api/...`` (integrators, ``runs.routing.integrator_websocket_urlpatterns``):
  the REST API's token only (``config.ws_token.TokenAuthMiddleware``);
  cookies are never read, so no Origin is needed or checked. Connection
  attempts are counted per token and per address first
  (``config.ws_throttle.ConnectThrottleMiddleware``: over the rate, 4429).
* everything else (browsers): the Django session cookie
  (``AuthMiddlewareStack``), from an allowed host
  (``AllowedHostsOriginValidator``) and from the very origin, port
  included, it was sent to (``config.origin.SameOriginValidator``).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Set up Django (apps, models) before importing anything that uses them.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import re_path  # noqa: E402

from config.origin import SameOriginValidator  # noqa: E402
from config.ws_throttle import ConnectThrottleMiddleware  # noqa: E402
from config.ws_token import TokenAuthMiddleware  # noqa: E402
from runs.routing import integrator_websocket_urlpatterns, websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": URLRouter([
        re_path(r"^ws/api/", ConnectThrottleMiddleware(
            TokenAuthMiddleware(URLRouter(integrator_websocket_urlpatterns)))),
        re_path(r"^", AllowedHostsOriginValidator(
            SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))))),
    ]),
})
