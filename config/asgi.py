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

HTTP requests run Django's middleware and views synchronously, in one hop
to a worker thread per request (``SyncChainASGIHandler``).
"""

import os

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

from config.secret_key import require_secret_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with the whole middleware chain and the view run as one synchronous call.

    Django's own handler builds an asynchronous chain. Every middleware
    built on ``MiddlewareMixin`` then runs its ``process_request`` and
    ``process_response`` through ``sync_to_async``, and a synchronous-only
    middleware switches back with ``async_to_sync``. With this project's
    middleware (all synchronous code) that came to about fifteen hops
    between the event loop and the request's thread per request, a few
    milliseconds of the API's latency. Here the chain is built as under WSGI
    and entered once, in the request's thread (``thread_sensitive``, as
    Django does for synchronous views). Signals, streaming and file
    responses are ``ASGIHandler``'s, unchanged. A client that disconnects
    no longer stops the request between two middlewares: the chain and the
    view run to their end, as under WSGI (an async view would run through
    ``async_to_sync`` and not be cancelled either; there is none).
    """

    def load_middleware(self, is_async=False):
        """Build the synchronous chain (``is_async`` is ignored), then wrap it as the awaitable Django expects."""
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)


# Set up Django (apps, models) before importing anything that uses them.
django.setup(set_prefix=False)
require_secret_key()  # a server signs sessions and CSRF tokens: never start one without a key
django_asgi_app = SyncChainASGIHandler()

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
