"""HTTP client of the demo payment gateway (``tools/demo/gateway_server.py``).

Every refund carries our idempotency key in the ``Idempotency-Key``
header; the gateway answers a repeated key with the first refund instead of
paying twice, and ``GET /refunds/<key>`` tells what became of a request
whose answer never arrived (reconciliation).

Two sides, one mapping. The tools' async handlers (awaited on the
engine's event loop) use the ``a``-prefixed coroutines over an
``aiohttp.ClientSession``; the core's sync callers (the ``reconcile`` hook
``lookup``, tests) use the plain functions over an ``httpx.Client``. Each
call is described once (``_Call``: the request and how its answer is read,
from an ``httpx.Response``: the async side hands aiohttp's answer over as
one); ``_send`` and ``_asend`` only carry it. A timeout is
``ToolTimeout``; a transport error or a 5xx ``ToolUnavailable``.

Why aiohttp on the async side: the engine sends every tool's request from
its one event loop, and there a request through ``httpx.AsyncClient``
(httpcore over anyio) costs about twenty times the CPU of aiohttp's (1.37
ms against 0.06 ms per GET, ``bench/client_floor.py`` on the benchmark
machine), which the worker pays per tool call (docs/benchmark-history.md).

A session is bound to the event loop it first ran on (its pooled
connections belong to that loop), so sessions are cached per running loop
and gateway URL (``_async_session``): the engine's one loop reuses one
pool, and each new loop (``asyncio.run``, the private loop of
``runs.base.awaiting.drive``) gets its own.
"""

import asyncio
import atexit
import contextlib
import functools
import threading
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Callable

import aiohttp
import httpx

from tools.demo import conf
from tools.registry import Reconciliation, ToolError, ToolTimeout, ToolUnavailable

LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=32)


@functools.lru_cache(maxsize=8)
def _client(base_url: str) -> httpx.Client:
    """One pooled HTTP client per gateway URL and process (keep-alive; TLS set up once; thread-safe)."""
    return httpx.Client(base_url=base_url, limits=LIMITS)


_async_sessions: dict[tuple[asyncio.AbstractEventLoop, str], aiohttp.ClientSession] = {}
_async_sessions_lock = threading.Lock()


def _async_session(base_url: str) -> aiohttp.ClientSession:
    """The pooled aiohttp session for ``base_url`` on the running event loop (made on first use).

    Keyed by the loop object itself (held here, so its id is never reused
    while it is a key). A session is kept as long as its loop is open (the
    engine's one loop; ``drive``'s loop of each thread that drives a step,
    between its calls too), so a request in flight always keeps its
    connection; whenever a session is made, those of loops that have been
    closed are dropped (``_drop``). Raises ``RuntimeError`` outside a
    running loop. Thread-safe.
    """
    key = (asyncio.get_running_loop(), base_url)
    with _async_sessions_lock:
        session = _async_sessions.get(key)
        if session is None:
            for stale in [k for k in _async_sessions if k[0].is_closed()]:
                _drop(stale[0], _async_sessions.pop(stale))
            session = _async_sessions[key] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=LIMITS.max_connections, keepalive_timeout=LIMITS.keepalive_expiry))
        return session


@atexit.register
def _drop_all() -> None:
    """At the process's end, close every session (their loops are gone or going)."""
    with _async_sessions_lock:
        while _async_sessions:
            (loop, _url), session = _async_sessions.popitem()
            _drop(loop, session)


def _drop(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    """Close ``session`` of ``loop`` without waiting for it.

    On a running loop (only at the process's end) the close is handed to
    that loop. Otherwise it is run here as far as it goes without waiting:
    on a closed loop aiohttp only marks the session and its connector
    closed, leaving the sockets to the garbage collector as the loop left
    them; on an open loop that is not running (only at the process's end)
    the transports' close is queued on that loop. Either way they do not
    report themselves unclosed when collected; what the close would wait
    for is abandoned.
    """
    if loop.is_running():
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            asyncio.run_coroutine_threadsafe(session.close(), loop)
            return
    closing = session.close()
    try:
        closing.send(None)
    except StopIteration:
        return
    closing.close()


@dataclass(frozen=True)
class _Call:
    """One request to the gateway: ``read(response)`` turns an answer below 500 into the result (raising ``ToolError`` or
    ``httpx.HTTPStatusError`` to refuse it); ``options``: further ``httpx`` request arguments.
    """

    method: str
    path: str
    read: Callable[[httpx.Response], Any]
    options: dict = field(default_factory=dict)


@contextlib.contextmanager
def _answer(timeout_s: float):
    """Around one request of the sync client: ``httpx`` timeouts become ``ToolTimeout``, other transport errors
    ``ToolUnavailable``."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise ToolTimeout(f"payment gateway did not answer within {timeout_s}s") from exc
    except httpx.TransportError as exc:
        raise ToolUnavailable(f"payment gateway unreachable: {exc}") from exc


def _read(call: _Call, response: httpx.Response):
    """``call.read(response)``; raises ``ToolUnavailable`` for a 5xx answer instead."""
    if response.status_code >= 500:
        raise ToolUnavailable(f"payment gateway error {response.status_code}: {response.text[:200]}")
    return call.read(response)


def _send(call: _Call, *, timeout_s: float):
    """Make ``call`` with the sync client; its result (``_read``), errors as ``_answer`` maps them."""
    with _answer(timeout_s):
        response = _client(conf.gateway_url()).request(call.method, call.path, timeout=timeout_s, **call.options)
    return _read(call, response)


_FRAMING = frozenset({"content-encoding", "content-length", "transfer-encoding"})


async def _asend(call: _Call, *, timeout_s: float):
    """``_send`` with the running loop's aiohttp session: ``timeout_s`` bounds the whole exchange; aiohttp's
    timeout is ``ToolTimeout``, its other errors ``ToolUnavailable``; a redirect is not followed (as ``httpx``
    does not). Cancelling the awaiting task passes through."""
    base_url = conf.gateway_url()
    url = base_url.rstrip("/") + call.path
    try:
        async with _async_session(base_url).request(call.method, url, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                                    allow_redirects=False, **call.options) as answer:
            body = await answer.read()
    except TimeoutError as exc:  # aiohttp's own timeouts are TimeoutErrors too
        raise ToolTimeout(f"payment gateway did not answer within {timeout_s}s") from exc
    except aiohttp.ClientError as exc:
        raise ToolUnavailable(f"payment gateway unreachable: {exc}") from exc
    # The body as aiohttp gave it (already decoded), so its framing and coding headers stay behind.
    headers = [(name, value) for name, value in answer.headers.items() if name.lower() not in _FRAMING]
    response = httpx.Response(answer.status, headers=headers, content=body, request=httpx.Request(call.method, url))
    return _read(call, response)


def _json_or_raise(response: httpx.Response):
    response.raise_for_status()
    return response.json()


# --- refunds -------------------------------------------------------------------

def _refund_read(response: httpx.Response) -> dict:
    if response.status_code not in (200, 201):
        raise ToolError(f"payment gateway refused the refund: {response.text[:200]}")
    return response.json()


async def arefund(*, order_number: int, amount: Decimal, idempotency_key: str, timeout_s: float) -> dict:
    """Refund ``amount`` on ``order_number`` once per ``idempotency_key``; ``{"refund_id", "idempotency_key", "order_id", "amount"}``.

    Raises ``ToolTimeout`` (no answer in ``timeout_s`` seconds), ``ToolUnavailable`` (unreachable, 5xx), ``ToolError`` (refused).
    """
    return await _asend(_Call("POST", "/refunds", _refund_read,
                              {"headers": {"Idempotency-Key": idempotency_key},
                               "json": {"order_id": order_number, "amount": str(amount)}}), timeout_s=timeout_s)


def _lookup_read(response: httpx.Response) -> Reconciliation:
    if response.status_code == 404:
        return Reconciliation("not_found")
    return Reconciliation("succeeded", result=_json_or_raise(response))


def lookup(idempotency_key: str, *, timeout_s: float = 5.0) -> Reconciliation:
    """What the gateway knows of ``idempotency_key``: ``succeeded`` with the refund, or ``not_found``.

    Raises ``ToolTimeout`` / ``ToolUnavailable`` as ``arefund`` does,
    ``httpx.HTTPStatusError`` for another 4xx.
    """
    return _send(_Call("GET", f"/refunds/{idempotency_key}", _lookup_read), timeout_s=timeout_s)


def _refunded_total_call(order_number: int, since: datetime | None) -> _Call:
    params = {"order_id": order_number}
    if since is not None:
        params["since"] = repr(since.timestamp())
    return _Call("GET", "/refunds", lambda response: Decimal(_json_or_raise(response)["total"]), {"params": params})


async def arefunded_total(order_number: int, *, since: datetime | None = None, timeout_s: float = 5.0) -> Decimal:
    """The sum of the refunds the gateway made on ``order_number`` (only those made at or after ``since``,
    an aware datetime, if given), asked on the running event loop. Raises ``ToolTimeout`` / ``ToolUnavailable``,
    or ``httpx.HTTPStatusError`` for a 4xx."""
    return await _asend(_refunded_total_call(order_number, since), timeout_s=timeout_s)


def ledger(*, timeout_s: float = 5.0) -> dict:
    """The gateway's whole ledger: ``{"refunds": [...], "requests_per_key": {key: n}}``."""
    return _send(_Call("GET", "/ledger", _json_or_raise), timeout_s=timeout_s)
