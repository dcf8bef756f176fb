"""WebSocket authentication for integrators: the REST API's token, never a cookie.

``TokenAuthMiddleware`` sets ``scope["user"]`` from the handshake's API
token (``rest_framework.authtoken``, checked by DRF's own
``TokenAuthentication.authenticate_credentials``: a missing key or an
inactive user is no user) and ``scope["auth_token"]`` to the key, so a
socket can check later that the token still exists. Anything else
(no token, a malformed one, a wrong one) leaves ``AnonymousUser``: the
consumer refuses the handshake. Cookies are never read here, so a page on
another site cannot ride a user's session on these routes, and no Origin
check is needed (``config.asgi`` keeps one for the cookie routes).

Where the token may be (never the query string, which lands in logs):

* the header ``Authorization: Token <key>``, as for the REST API;
* for clients that cannot set headers (browsers' ``WebSocket``): two
  offered subprotocols, ``tollgate`` and ``tollgate.token.<key>``. The
  server selects ``tollgate``, so the key is not echoed back.
"""

from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

SUBPROTOCOL = "tollgate"
TOKEN_SUBPROTOCOL_PREFIX = "tollgate.token."
_KEYWORD = "token"
_MAX_KEY_CHARS = 256


def handshake_token(scope) -> str | None:
    """The API token key a WebSocket ``scope`` carries (header first, then subprotocol), or None.

    The header must be ``Token <key>`` (keyword in any case, one space-free
    key); the subprotocol counts only beside a plain ``tollgate`` offer, the
    one the server will select. Keys longer than 256 characters are ignored.
    """
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() == _KEYWORD and len(parts[1]) <= _MAX_KEY_CHARS:
                return parts[1]
            return None
    offered = scope.get("subprotocols") or ()
    if SUBPROTOCOL in offered:
        for protocol in offered:
            if protocol.startswith(TOKEN_SUBPROTOCOL_PREFIX) and len(protocol) <= _MAX_KEY_CHARS:
                return protocol[len(TOKEN_SUBPROTOCOL_PREFIX):] or None
    return None


def token_owner(key: str):
    """The active user token ``key`` belongs to, or None (no such token, inactive user). Synchronous."""
    try:
        user, _ = TokenAuthentication().authenticate_credentials(key)
    except AuthenticationFailed:
        return None
    return user


class TokenAuthMiddleware:
    """ASGI middleware: ``scope["user"]`` and ``scope["auth_token"]`` from the handshake's API token (see module doc)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        key = handshake_token(scope)
        user = await database_sync_to_async(token_owner)(key) if key else None
        scope = dict(scope, user=user or AnonymousUser(), auth_token=key if user else None)
        return await self.application(scope, receive, send)
