"""HTTP client of the demo payment gateway (``tools/demo/gateway_server.py``).

Every refund carries our idempotency key in the ``Idempotency-Key``
header; the gateway answers a repeated key with the first refund instead of
paying twice, and ``GET /refunds/<key>`` tells what became of a request
whose answer never arrived (reconciliation).
"""

import functools
from datetime import datetime
from decimal import Decimal

import httpx

from tools.demo import conf
from tools.registry import Reconciliation, ToolError, ToolTimeout, ToolUnavailable


@functools.lru_cache(maxsize=8)
def _client(base_url: str) -> httpx.Client:
    """One pooled HTTP client per gateway URL and process (keep-alive; TLS set up once; thread-safe)."""
    return httpx.Client(base_url=base_url, limits=httpx.Limits(max_connections=32, max_keepalive_connections=8))


def _call(method: str, path: str, *, timeout_s: float, **kwargs) -> httpx.Response:
    try:
        response = _client(conf.gateway_url()).request(method, path, timeout=timeout_s, **kwargs)
    except httpx.TimeoutException as exc:
        raise ToolTimeout(f"payment gateway did not answer within {timeout_s}s") from exc
    except httpx.TransportError as exc:
        raise ToolUnavailable(f"payment gateway unreachable: {exc}") from exc
    if response.status_code >= 500:
        raise ToolUnavailable(f"payment gateway error {response.status_code}: {response.text[:200]}")
    return response


def refund(*, order_number: int, amount: Decimal, idempotency_key: str, timeout_s: float) -> dict:
    """Refund ``amount`` on ``order_number`` once per ``idempotency_key``.

    Returns the refund ``{"refund_id", "idempotency_key", "order_id",
    "amount"}``. Raises ``ToolTimeout`` (no answer in ``timeout_s``),
    ``ToolUnavailable`` (unreachable or 5xx) or ``ToolError`` (refused).
    """
    response = _call("POST", "/refunds", timeout_s=timeout_s, headers={"Idempotency-Key": idempotency_key},
                     json={"order_id": order_number, "amount": str(amount)})
    if response.status_code not in (200, 201):
        raise ToolError(f"payment gateway refused the refund: {response.text[:200]}")
    return response.json()


def lookup(idempotency_key: str, *, timeout_s: float = 5.0) -> Reconciliation:
    """What the gateway knows of ``idempotency_key``: ``succeeded`` with the refund, or ``not_found``."""
    response = _call("GET", f"/refunds/{idempotency_key}", timeout_s=timeout_s)
    if response.status_code == 404:
        return Reconciliation("not_found")
    response.raise_for_status()
    return Reconciliation("succeeded", result=response.json())


def refunded_total(order_number: int, *, since: datetime | None = None, timeout_s: float = 5.0) -> Decimal:
    """The sum of the refunds the gateway made on ``order_number`` (only those made at or after ``since``, if given)."""
    params = {"order_id": order_number}
    if since is not None:
        params["since"] = repr(since.timestamp())
    response = _call("GET", "/refunds", timeout_s=timeout_s, params=params)
    response.raise_for_status()
    return Decimal(response.json()["total"])


def ledger(*, timeout_s: float = 5.0) -> dict:
    """The gateway's whole ledger: ``{"refunds": [...], "requests_per_key": {key: n}}``."""
    response = _call("GET", "/ledger", timeout_s=timeout_s)
    response.raise_for_status()
    return response.json()
