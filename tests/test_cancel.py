"""Cancellation: at once when nothing runs, at the next safe point when a worker is on it."""

import pytest

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from approvals.services import reconcile_interrupt
from runs.engine.actors import advance_run
from runs.models import RunStatus
from runs.transitions import apply
from runs.engine.lifecycle import cancel_run, start_run
from tests.durability import lookup_agent, make_agent
from tests.fake_tools import transfers
from tools import registry
from tools.models import ToolCall, ToolCallStatus
from tools.registry import Tool, ToolTimeout


def test_running_run_is_cancelled_at_its_next_safe_point(people, idle_worker):
    run = start_run(agent=lookup_agent(), user=people["requester"], input="look a up")
    apply(run.start, actor="worker")  # a worker has it
    cancel_run(run=run, actor="user:requester")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.cancel_requested_at is not None

    idle_worker.worker.start()
    advance_run.send(run.pk)
    idle_worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.events.filter(type="transition", to_status="cancelled", reason="cancelled at a safe point").exists()
    assert not run.steps.exists(), "no model call after the cancel request"


def test_cancelling_a_waiting_run_cancels_its_approval_and_call(people, worker):
    agent = make_agent("transfer", [{"tool_calls": [{"name": "fake_transfer",
                                                     "arguments": {"account": "acme", "amount": 50}}]},
                                    {"content": "Sent."}], tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 50 to acme")
    worker.drain()
    cancel_run(run=run, actor="user:requester")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert Interrupt.objects.get(run=run).status == InterruptStatus.CANCELLED
    assert ToolCall.objects.get(run=run, name="fake_transfer").status == ToolCallStatus.CANCELLED
    assert transfers() == []


@pytest.fixture
def payout(monkeypatch):
    def handler(ctx, args):
        raise ToolTimeout("bank did not answer")

    monkeypatch.setitem(registry._TOOLS, "payout", Tool(
        name="payout", description="Pay out.", handler=handler, side_effect=True,
        parameters={"type": "object", "properties": {"amount": {"type": "number"}}}))


def test_an_unknown_effect_stays_to_be_reconciled_after_the_run_is_cancelled(people, worker, payout):
    agent = make_agent("payout", [{"tool_calls": [{"name": "payout", "arguments": {"amount": 5}}]},
                                  {"content": "Paid."}], tools=["payout"])
    run = start_run(agent=agent, user=people["requester"], input="pay")
    worker.drain()
    cancel_run(run=run, actor="user:requester")

    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION)
    assert item.status == InterruptStatus.PENDING
    reconcile_interrupt(interrupt=item, user=people["approver"], succeeded=True, result={"paid": 5},
                        evidence="bank: paid at 09:14")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.SUCCEEDED
