"""The chaos run's refund agent (``bench/chaos.py``) against the demo's real gateway, one run at a time.

The gateway's injected faults can make a refund end ``failed`` honestly
(every send refused before any charge); the agent must then do what a
model told the refund did not happen would do, not run out of script.
"""

import pytest

from approvals.models import Interrupt
from approvals.services import reconcile_interrupt
from bench.chaos import new_order_and_agent
from runs.engine.lifecycle import start_run
from runs.models import RunStatus
from tools import registry
from tools.demo import gateway
from tools.models import ToolCall, ToolCallStatus


@pytest.fixture
def one_reconcile_look(settings):
    """A person asked after one look of the reconcile hook (the chaos run allows 8, about a minute of backoff)."""
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 1}


def _settle_as_the_chaos_approver(run, approver) -> None:
    """Settle the run's reconciliation item as ``bench/chaos.py``'s ``reconcile_pending`` does: by the ledger."""
    item = Interrupt.objects.get(run=run, kind="reconciliation", status="pending")
    found = gateway.lookup(item.tool_call.idempotency_key)
    reconcile_interrupt(interrupt=item, user=approver, succeeded=found.status == "succeeded", result=found.result,
                        evidence=f"gateway ledger lookup: {found.status}")


def test_a_refund_that_failed_without_a_charge_is_made_again_and_the_run_completes(
        demo, worker, payment_gateway, one_reconcile_look):
    # Every send of the first refund refused before any charge (a 503 each: max_attempts of them), its key then
    # unknown to the gateway: a person settles it failed. The refund check says no refund was issued; the agent
    # refunds again (a new call, a new key) rather than failing model_error for want of a turn.
    attempts = registry.get_tool("refund").max_attempts
    payment_gateway.faults(script=["error_before_commit"] * attempts)
    agent = new_order_and_agent(demo["requester"], 1_000_000_001, amount=20)  # 20: no approval needed
    run = start_run(agent=agent, user=demo["requester"], input="refund order 1000000001")

    worker.drain()
    _settle_as_the_chaos_approver(run, demo["approver"])
    worker.drain()

    run.refresh_from_db()
    refunds = list(ToolCall.objects.filter(run=run, name="refund").order_by("pk").values_list("status", "attempts"))
    assert (run.status, run.outcome, run.failure_type) == (RunStatus.COMPLETED, "achieved", ""), run.error
    assert refunds == [(ToolCallStatus.FAILED, attempts), (ToolCallStatus.SUCCEEDED, 1)]
    assert [r["amount"] for r in payment_gateway.ledger()["refunds"]] == ["20.00"]  # charged once
