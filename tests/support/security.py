"""Fixtures and helpers shared by the security tests: inbox items to attack, a snapshot of what is stored,
JSON nested too deep.

Import the fixtures into a test module to use them.
"""

import pytest

from approvals.models import Interrupt, InterruptKind
from runs.models import Agent, IdempotentRequest, Run, RunEvent, Session
from runs.engine.lifecycle import start_run
from tests.support.core import transfer
from tests.support.durability import make_agent
from tools import registry
from tools.models import ToolCall
from tools.registry import Tool, ToolTimeout

# JSON nested 1000 deep, far past the depth ``config.strict_json`` allows.
DEEP = "[" * 1000 + "]" * 1000


@pytest.fixture
def approval_item(demo, worker) -> Interrupt:
    """The pending approval of the demo refund (80.00 of order 123), its run waiting."""
    run = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"], input="Refund order 123.")
    worker.drain()
    return Interrupt.objects.get(run=run, kind=InterruptKind.APPROVAL, status="pending")


@pytest.fixture
def core_approval_item(people, worker) -> Interrupt:
    """``approval_item`` without the demo: the pending approval of a ``fake_transfer`` of 80 to acme, its run
    waiting."""
    agent = make_agent("transfer-80", [{"tool_calls": [transfer("acme", 80)]}, {"content": "Sent."}],
                       tools=["fake_transfer"], check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="Send 80 to acme.")
    worker.drain()
    return Interrupt.objects.get(run=run, kind=InterruptKind.APPROVAL, status="pending")


@pytest.fixture
def reconciliation_item(demo, worker, monkeypatch) -> Interrupt:
    """A pending reconciliation item: a side-effecting tool without a reconcile hook timed out."""

    def handler(ctx, args):
        raise ToolTimeout("bank did not answer")

    tool = Tool(name="wire_transfer", description="Send money.", handler=handler, side_effect=True,
                parameters={"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]})
    monkeypatch.setitem(registry._TOOLS, "wire_transfer", tool)
    agent = make_agent("wire", [{"tool_calls": [{"name": "wire_transfer", "arguments": {"amount": 10}}]},
                                {"content": "Transferred."}], tools=["wire_transfer"])
    run = start_run(agent=agent, user=demo["requester"], input="pay the supplier")
    worker.drain()
    return Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION, status="pending")


def stored_state() -> tuple:
    """What a refused request must leave unchanged: counts, statuses, decisions and arguments of every row."""
    return (
        tuple(Agent.objects.order_by("pk").values_list("slug", "model", "max_model_calls", "deadline_s")),
        tuple(Run.objects.order_by("pk").values_list("pk", "status", "cancel_requested_at")),
        RunEvent.objects.count(),
        tuple(Interrupt.objects.order_by("pk").values_list("pk", "status", "decision", "edited_arguments")),
        tuple(ToolCall.objects.order_by("pk").values_list("pk", "status", "arguments", "result")),
        tuple(Session.objects.order_by("pk").values_list("pk", "title", "metadata")),
        IdempotentRequest.objects.count(),
    )



@pytest.fixture
def core_reconciliation_item(people, worker, monkeypatch) -> Interrupt:
    """``reconciliation_item`` without the demo: the pending reconciliation item of a ``fake_transfer`` of 5 to
    acme that made its transfer and then timed out (``time_out_after_commit``), the tool's reconcile hook taken
    away for this test, so only a person can settle it; the requester from ``people``."""
    import dataclasses

    from tests.support.fake_tools import FAKE_TRANSFER, time_out_after_commit

    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(FAKE_TRANSFER, reconcile=None))
    time_out_after_commit()
    agent = make_agent("transfer-5", [{"tool_calls": [transfer("acme", 5)]}, {"content": "Sent."}],
                       tools=["fake_transfer"], check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="Send 5 to acme.")
    worker.drain()
    return Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION, status="pending")
