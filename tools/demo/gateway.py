"""HTTP client of the demo payment gateway (``tools/demo/gateway_server.py``).

Every refund carries our idempotency key in the ``Idempotency-Key``
header; the gateway answers a repeated key with the first refund instead of
paying twice, and ``GET /refunds/<key>`` tells what became of a request
whose answer never arrived (reconciliation).

Two sides, one mapping. The tools' async handlers (awaited on the
engine's event loop) use the ``a``-prefixed coroutines over an
``httpx.AsyncClient``; the core's sync callers (the ``reconcile`` hook
``lookup``, preconditions, tests) use the plain functions over an
``httpx.Client``. Each call is described once (``_Call``: the request and
how its answer is read); ``_send`` and ``_asend`` only carry it, and both
map errors in ``_answer``: a timeout is ``ToolTimeout``, a transport error
or a 5xx ``ToolUnavailable``.

An ``httpx.AsyncClient`` is bound to the event loop it first ran on (its
pooled connections belong to that loop), so async clients are cached per
running loop and gateway URL (``_async_client``): the engine's one loop
reuses one pool, and each new loop (``asyncio.run``, the private loop of
``runs.base.awaiting.drive``) gets its own.
"""

import asyncio
import contextlib
import functools
import threading
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Callable

import httpx

from tools.demo import conf
from tools.registry import Reconciliation, ToolError, ToolTimeout, ToolUnavailable

LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=32)
MAX_ASYNC_CLIENTS = 8  # (loop, URL) pairs kept; more happen only in tests that make many loops


@functools.lru_cache(maxsize=8)
def _client(base_url: str) -> httpx.Client:
    """One pooled HTTP client per gateway URL and process (keep-alive; TLS set up once; thread-safe)."""
    return httpx.Client(base_url=base_url, limits=LIMITS)


_async_clients: dict[tuple[asyncio.AbstractEventLoop, str], httpx.AsyncClient] = {}
_async_clients_lock = threading.Lock()


def _async_client(base_url: str) -> httpx.AsyncClient:
    """The pooled async client for ``base_url`` on the running event loop (made on first use).

    Keyed by the loop object itself (held here, so its id is never reused
    while it is a key); the clients of loops that have been closed are
    dropped whenever a client is made, and at most ``MAX_ASYNC_CLIENTS``
    are kept (an evicted one is left to the garbage collector: its loop
    may be gone, so it cannot always be closed). Raises ``RuntimeError``
    outside a running loop. Thread-safe.
    """
    key = (asyncio.get_running_loop(), base_url)
    with _async_clients_lock:
        client = _async_clients.get(key)
        if client is None:
            for stale in [k for k in _async_clients if k[0].is_closed()]:
                del _async_clients[stale]
            client = _async_clients[key] = httpx.AsyncClient(base_url=base_url, limits=LIMITS)
            while len(_async_clients) > MAX_ASYNC_CLIENTS:
                del _async_clients[next(iter(_async_clients))]
        return client


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
    """Around one request: ``httpx`` timeouts become ``ToolTimeout``, other transport errors
    ``ToolUnavailable``. Cancelling the awaiting task (the engine's own timeout) passes through."""
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


async def _asend(call: _Call, *, timeout_s: float):
    """``_send`` with the running loop's async client."""
    with _answer(timeout_s):
        response = await _async_client(conf.gateway_url()).request(call.method, call.path, timeout=timeout_s,
                                                                   **call.options)
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


def refunded_total(order_number: int, *, since: datetime | None = None, timeout_s: float = 5.0) -> Decimal:
    """The sum of the refunds the gateway made on ``order_number`` (only those made at or after ``since``,
    an aware datetime, if given). Raises ``ToolTimeout`` / ``ToolUnavailable``, or ``httpx.HTTPStatusError``
    for a 4xx."""
    return _send(_refunded_total_call(order_number, since), timeout_s=timeout_s)


async def arefunded_total(order_number: int, *, since: datetime | None = None, timeout_s: float = 5.0) -> Decimal:
    """``refunded_total`` on the running event loop."""
    return await _asend(_refunded_total_call(order_number, since), timeout_s=timeout_s)


def ledger(*, timeout_s: float = 5.0) -> dict:
    """The gateway's whole ledger: ``{"refunds": [...], "requests_per_key": {key: n}}``."""
    return _send(_Call("GET", "/ledger", _json_or_raise), timeout_s=timeout_s)
