"""Connection attempts to the integrators' WebSockets, counted per API token and per client address.

The REST API's throttles (``config.throttles``) never see a WebSocket
handshake, and each handshake costs a token lookup in the database before
the consumer even starts. ``ConnectThrottleMiddleware`` sits in front of
``config.ws_token.TokenAuthMiddleware`` and counts every attempt, before
any database work, under two keys in Django's default cache (``CACHE_URL``,
shared by every server process, as the API's counters are):

* the token offered (``ws_token.handshake_token``; a hash of it, never the
  key itself), right or wrong: one leaked or guessed token cannot open
  sockets without end;
* the client's address, chosen as the REST API chooses it (DRF's
  ``get_ident``: ``REMOTE_ADDR``, or behind ``TOLLGATE_TRUSTED_PROXIES``
  proxies the X-Forwarded-For entry they appended): trying many tokens
  from one place is bounded too.

The rates are ``TOLLGATE["WS_CONNECT_RATES"]`` (``{"token": "30/min",
"address": "60/min"}`` by default, ``THROTTLE_WS_TOKEN`` /
``THROTTLE_WS_ADDRESS``; DRF's rate syntax, ``<count>/<s|min|hour|day>``).
A count starts at a key's first attempt and ends ``period`` seconds later
(an atomic ``incr`` of a key that expires then, the usual fixed-window
counter), so a client gets at most the rate in any window and at most
twice it across two. An attempt over either rate is accepted only to be
closed at once with code 4429 (``TOO_MANY_ATTEMPTS``, by analogy with HTTP
429), so the client can tell it from a refusal (403) and back off; the
consumer never runs.
"""

import hashlib

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from rest_framework.throttling import BaseThrottle

from config.ws_token import SUBPROTOCOL, handshake_token

TOO_MANY_ATTEMPTS = 4429  # close code: connection attempts over the rate
PERIODS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}  # DRF's: the period's first letter


def parse_rate(rate: str) -> tuple[int, int]:
    """``"30/min"`` → ``(30, 60)``: attempts allowed and the window in seconds (DRF's rate syntax).

    Raises ``ImproperlyConfigured`` for anything else (a count below 1, an unknown period).
    """
    count, _slash, period = (rate or "").partition("/")
    seconds = PERIODS_S.get(period.strip()[:1].lower())
    if not count.strip().isdigit() or int(count) < 1 or seconds is None:
        raise ImproperlyConfigured(f"A WebSocket connection rate must look like 30/min, not {rate!r}.")
    return int(count), seconds


def client_address(scope) -> str:
    """The client's address for a WebSocket ``scope``, by the REST API's rule (DRF's ``get_ident``, ``NUM_PROXIES``)."""
    request = HttpRequest()
    request.META["REMOTE_ADDR"] = (scope.get("client") or ("",))[0] or ""
    for name, value in scope.get("headers") or ():
        if name == b"x-forwarded-for":
            request.META["HTTP_X_FORWARDED_FOR"] = value.decode("latin-1")
    return BaseThrottle().get_ident(request)


def _attempts(key: str, period_s: int) -> int:
    """Count one attempt under ``key`` in the window that began at its first attempt; returns the count."""
    cache.add(key, 0, timeout=period_s)
    try:
        count = cache.incr(key)
    except ValueError:  # the key expired (or was evicted) between the two calls: this attempt starts a window
        cache.add(key, 1, timeout=period_s)
        return 1
    if count == 1:  # the first attempt of a window: make sure the key expires (an incr may have re-created it)
        cache.touch(key, timeout=period_s)
    return count


def over_the_rate(scope) -> bool:
    """Count this handshake's attempt under its token (if any) and its address; True if either is over its rate.

    Synchronous (the cache may be Redis); call it through ``sync_to_async``.
    """
    rates = settings.TOLLGATE["WS_CONNECT_RATES"]
    keys = [("address", client_address(scope))]
    token = handshake_token(scope)
    if token:
        keys.append(("token", hashlib.sha256(token.encode()).hexdigest()))
    over = False
    for kind, identity in keys:
        allowed, period_s = parse_rate(rates[kind])
        over = _attempts(f"ws-connect:{kind}:{identity}", period_s) > allowed or over
    return over


class ConnectThrottleMiddleware:
    """ASGI middleware for WebSocket routes: attempts over ``WS_CONNECT_RATES`` are closed with 4429 (module doc)."""

    def __init__(self, application):
        self.application = application
        for rate in settings.TOLLGATE["WS_CONNECT_RATES"].values():
            parse_rate(rate)  # a bad setting stops the server at start, not at the first connection

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and await sync_to_async(over_the_rate)(scope):
            return await _refuse(scope, receive, send)
        return await self.application(scope, receive, send)


async def _refuse(scope, receive, send) -> None:
    """Answer the handshake and close at once with ``TOO_MANY_ATTEMPTS`` (selecting ``tollgate`` if offered, as
    browsers require a subprotocol answer to one they offered)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    accept = {"type": "websocket.accept"}
    if SUBPROTOCOL in (scope.get("subprotocols") or ()):
        accept["subprotocol"] = SUBPROTOCOL
    await send(accept)
    await send({"type": "websocket.close", "code": TOO_MANY_ATTEMPTS})
