"""ASGI entry point: Django for HTTP, Channels for the run WebSockets.

Two kinds of WebSocket, each with its own authentication:

* ``ws/api/...`` (integrators, ``runs.web.routing.integrator_websocket_urlpatterns``):
  the REST API's token only (``config.ws_token.TokenAuthMiddleware``);
  cookies are never read, so no Origin is needed or checked. Connection
  attempts are counted per token and per address first
  (``config.ws_throttle.ConnectThrottleMiddleware``: over the rate, 4429).
* everything else (browsers): the Django session cookie
  (``AuthMiddlewareStack``), from an allowed host
  (``AllowedHostsOriginValidator``) and from the very origin, port
  included, it was sent to (``config.origin.SameOriginValidator``).

HTTP requests run Django's middleware and views synchronously, in one hop
to a thread of their own, kept for later requests once they are answered
(``SyncChainASGIHandler``, ``RequestThreads``), and no request
body over ``TOLLGATE["REQUEST_BODY_MAX_BYTES"]`` is read (413,
``config.body_limit``), whichever ASGI server runs this application.

Once loaded, the process freezes what it imported out of the garbage
collector's walks (``runs.base.collector.settle``).
"""

import os
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpResponse

from config.body_limit import BodyTooLarge, declared_length, max_body_bytes, too_large_answer

from config.secret_key import require_secret_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class RequestThreads:
    """Single-thread executors for requests' synchronous code, kept for later requests.

    Django's handler runs each request in a ``ThreadSensitiveContext`` of
    its own, which starts a thread for it and ends that thread afterwards
    (about 0.5 ms per request on a 2-core machine, more when it is busy).
    Here a request takes an idle executor (a new one when none is idle)
    and gives it back once it is answered, so requests still run side by
    side, each in one thread, as many at once as come in. At most
    ``idle_max`` idle executors are kept. Used from the server's event loop
    only (no lock). Source: asgiref's ``ThreadSensitiveContext(executor=...)``,
    whose caller owns and reuses the executor.
    """

    def __init__(self, idle_max: int = 64):
        self.idle_max = idle_max
        self._idle: list[ThreadPoolExecutor] = []

    def take(self) -> ThreadPoolExecutor:
        """An idle executor, or a new one."""
        return self._idle.pop() if self._idle else ThreadPoolExecutor(1, thread_name_prefix="http-request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        """Keep ``executor`` for a later request (shut down when ``idle_max`` are kept already)."""
        if len(self._idle) < self.idle_max:
            self._idle.append(executor)
        else:
            executor.shutdown(wait=False)


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

    threads = RequestThreads()

    async def __call__(self, scope, receive, send):
        """Django's, with the request's thread taken from ``threads`` and given back once it is answered; a
        request cut short (its task cancelled, or an error) may still have code running in its thread, so
        that thread is not given to another request: its executor is shut down once that code ends."""
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.take()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self.threads.give_back(executor)

    def load_middleware(self, is_async=False):
        """Build the synchronous chain (``is_async`` is ignored), then wrap it as the awaitable Django expects."""
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)

    async def handle(self, scope, receive, send):
        """Django's, after refusing a body over ``max_body_bytes()``: a declared one unread, a growing one cut off.

        Both answer 413 (``too_large_answer``) before the request exists, so
        no middleware, authentication or view sees it.
        """
        declared = declared_length(scope["headers"])
        if declared is not None and declared > max_body_bytes():
            await self._send_too_large(scope, send)
            return
        try:
            await super().handle(scope, receive, send)
        except BodyTooLarge:
            await self._send_too_large(scope, send)

    async def read_body(self, receive):
        """Django's spooled body, raising ``BodyTooLarge`` at the message that takes it past the limit."""
        limit, received = max_body_bytes(), 0

        async def receive_within_limit():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge
            return message

        return await super().read_body(receive_within_limit)

    async def _send_too_large(self, scope, send):
        content_type, body = too_large_answer(scope["path"])
        await self.send_response(HttpResponse(body, status=413, content_type=content_type), send)


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
from runs.web.routing import integrator_websocket_urlpatterns, websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": URLRouter([
        re_path(r"^ws/api/", ConnectThrottleMiddleware(
            TokenAuthMiddleware(URLRouter(integrator_websocket_urlpatterns)))),
        re_path(r"^", AllowedHostsOriginValidator(
            SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))))),
    ]),
})

from runs.base import collector  # noqa: E402

collector.settle()  # what a server process imported above is frozen out of the collector's walks
