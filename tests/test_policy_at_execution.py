"""Policy is checked again just before a call runs, and provider call ids cannot collide."""

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.engine.lifecycle import start_run
from tests.durability import make_agent
from tools.models import ToolCall, ToolCallStatus


def test_two_approved_refunds_cannot_exceed_the_order_total(demo, worker, payment_gateway):
    refund = {"name": "refund", "arguments": {"order_id": 123, "amount": 70}}
    refund_again = {"name": "refund", "arguments": {"order_id": 123, "amount": 60}}
    agent = make_agent("double", [{"tool_calls": [refund, refund_again]}, {"content": "Done."}],
                       tools=["refund"], check="refund")
    run = start_run(agent=agent, user=demo["requester"], input="refund 123 twice")
    worker.drain()
    for item in Interrupt.objects.filter(run=run):  # both passed the check when proposed
        decide_interrupt(interrupt=item, user=demo["approver"], decision="approved")
    worker.drain()

    first, second = ToolCall.objects.filter(run=run).order_by("id")
    assert first.status == ToolCallStatus.SUCCEEDED
    assert second.status == ToolCallStatus.DENIED
    assert "at most 50.00" in second.error
    assert [r["amount"] for r in payment_gateway.ledger()["refunds"]] == ["70.00"]


def test_reused_provider_call_ids_still_pair_every_result_with_its_call(people, worker):
    lookup = {"id": "call_0", "name": "fake_lookup", "arguments": {"key": "a"}}
    agent = make_agent("reuse-ids", [{"tool_calls": [lookup]}, {"tool_calls": [lookup]}, {"content": "Done."}],
                       tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="look twice")
    worker.drain()

    ids = list(ToolCall.objects.filter(run=run).order_by("id").values_list("provider_call_id", flat=True))
    assert len(set(ids)) == 2 and ids[0] == "call_0"
    results = list(run.messages.filter(role="tool").values_list("tool_call_id", flat=True))
    assert results == ids
    run.refresh_from_db()
    assert run.status == "completed"
