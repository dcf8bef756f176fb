"""Helpers of the inbox workflow tests (bulk decisions, history, claims), in-process and in the browser."""

from approvals.models import Interrupt
from tests.support.api import create_agent, start_run

# Demo orders whose total (65.00 to 110.00) leaves room for a refund of 55.00, which needs approval (over 50).
REFUNDABLE_ORDERS = (101, 102, 103, 104, 108, 109)


def refund_items(api, demo, worker, orders=REFUNDABLE_ORDERS, amount: int = 55) -> list[Interrupt]:
    """One run per order in ``orders``, each refunding ``amount`` and drained until it waits; their items, in order."""
    items = []
    for order in orders:
        agent = create_agent(api(demo["admin"]), f"refund-{order}", [
            {"tool_calls": [{"name": "refund", "arguments": {"order_id": order, "amount": amount}}]},
            {"content": f"Refunded {amount}.00 on order {order}."}])
        run = start_run(api(demo["requester"]), agent["slug"])
        worker.drain()
        items.append(Interrupt.objects.get(run_id=run["id"]))
    return items
