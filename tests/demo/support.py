"""Helpers of the demo's tests: its refund calls and turns, agents of its tools, its gateway's ledger."""

from tests.support.api import create_agent
from tools.demo import gateway

REFUND_CALL = {"name": "refund", "arguments": "{\"order_id\": 123, \"amount\": 80}"}
QUERY_CALL = {"name": "query_order", "arguments": {"order_id": 123}}


def refund_turns(amount: int = 30) -> list[dict]:
    """query order 123, refund ``amount`` on it, then say so."""
    return [
        {"tool_calls": [QUERY_CALL]},
        {"tool_calls": [{"name": "refund", "arguments": {"order_id": 123, "amount": amount}}]},
        {"content": f"Refunded {amount}."},
    ]


def demo_agent(admin_api, slug: str, turns: list[dict], **extra) -> dict:
    """``tests.support.api.create_agent`` with the demo's ``query_order`` and ``refund`` and its ``refund`` check."""
    return create_agent(admin_api, slug, turns, **{"tools": ["query_order", "refund"], "completion_check": "refund",
                                                   **extra})


def gateway_refunds() -> list[dict]:
    """Every refund the payment gateway made: ``[{"refund_id", "idempotency_key", "order_id", "amount"}]``."""
    return gateway.ledger()["refunds"]
