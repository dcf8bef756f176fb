"""ASGI entry point: Django for HTTP, Channels for the run WebSockets.

WebSockets authenticate with the Django session cookie
(``AuthMiddlewareStack``), must come from an allowed host
(``AllowedHostsOriginValidator``) and from the very origin, port
included, they were sent to (``config.origin.SameOriginValidator``).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Set up Django (apps, models) before importing anything that uses them.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.origin import SameOriginValidator  # noqa: E402
from runs.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": AllowedHostsOriginValidator(
        SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
})
