"""WebSocket origin check with the port: a browser's socket must come from the page's own origin.

Channels' ``AllowedHostsOriginValidator`` compares the Origin's host name
with ``ALLOWED_HOSTS`` and ignores the port, so a page served by another
program on the same host (``http://127.0.0.1:9999``) could open sockets
with the user's cookies. ``SameOriginValidator`` accepts a handshake only
when its Origin equals the Host it was sent to (scheme default ports
filled in) or is listed in ``CSRF_TRUSTED_ORIGINS``, as Django's CSRF
check does for forms. A handshake without an Origin (not a browser) is
left to authentication.
"""

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _netloc(host: str, port: int | None, scheme: str) -> tuple[str, int | None]:
    return host.lower(), port or _DEFAULT_PORTS.get(scheme)


def origin_allowed(origin: str, host_header: str, scope_scheme: str) -> bool:
    """Whether a handshake's ``origin`` matches the ``host_header`` it was sent to, port included.

    ``scope_scheme`` is ``ws`` or ``wss`` (it decides the Host's default
    port). Origins in ``CSRF_TRUSTED_ORIGINS`` are accepted too. Any
    unparsable value is refused.
    """
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    try:
        parsed_origin = urlsplit(origin)
        parsed_host = urlsplit(f"//{host_header}")
        origin_port, host_port = parsed_origin.port, parsed_host.port
    except ValueError:
        return False
    if not parsed_origin.hostname or not parsed_host.hostname:
        return False
    expected_scheme = "https" if scope_scheme == "wss" else "http"
    if parsed_origin.scheme != expected_scheme and not (
            settings.SECURE_PROXY_SSL_HEADER and parsed_origin.scheme == "https"):
        return False
    return (_netloc(parsed_origin.hostname, origin_port, parsed_origin.scheme)
            == _netloc(parsed_host.hostname, host_port, parsed_origin.scheme))


class SameOriginValidator:
    """ASGI middleware: deny a WebSocket handshake whose Origin is another origin (see module doc)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin")
        if origin is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            if not origin_allowed(origin.decode("latin-1"), host, scope.get("scheme", "ws")):
                denier = WebsocketDenier()
                return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
