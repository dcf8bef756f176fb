"""Policy is checked again just before a call runs (unless a read was assessed a moment ago), idempotency
keys after failures, and provider call ids cannot collide."""

import dataclasses
import json

import pytest
from asgiref.sync import sync_to_async

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.engine import loop
from runs.engine.lifecycle import start_run
from tests.support.api import tool_messages
from tests.support.durability import make_agent
from tests.support.fake_tools import transfers
from tools import registry
from tools.demo.models import Order
from tools.models import ToolCall, ToolCallStatus
from tools.registry import ToolError
from tools.services import idempotency_key_base

QUERY = {"tool_calls": [{"name": "query_order", "arguments": {"order_id": 123}}]}


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


# --- when the precondition is checked again (and when it need not be) -------------------------------


@pytest.fixture
def checks(monkeypatch):
    """Wrap the demo tools' preconditions: ``checks`` lists ``(tool, "assessed" | "rechecked")`` per call."""
    seen: list[tuple[str, str]] = []

    def counted(name, precondition):
        def check(ctx, arguments):
            seen.append((name, "assessed" if ctx.tool_call is None else "rechecked"))
            return precondition(ctx, arguments)
        return check

    for name in ("query_order", "refund"):
        tool = registry.get_tool(name)
        monkeypatch.setitem(registry._TOOLS, name, dataclasses.replace(
            tool, precondition=counted(name, tool.precondition)))
    return seen


def test_a_read_proposed_and_run_in_one_slice_is_not_checked_twice(demo, worker, checks):
    agent = make_agent("read-now", [QUERY, {"content": "Looked."}], tools=["query_order"])
    run = start_run(agent=agent, user=demo["requester"], input="look")
    worker.drain()

    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCallStatus.SUCCEEDED and call.result["order_id"] == 123
    assert checks == [("query_order", "assessed")]
    assert json.loads(tool_messages(run.pk)[0]) == {"status": "succeeded", "result": call.result}


@pytest.mark.parametrize("later", ["next slice", "after approval"])
def test_a_read_picked_up_later_is_checked_again(demo, idle_worker, monkeypatch, checks, later):
    """Between proposal and execution the order changed hands: the re-check denies the read."""
    agent = make_agent("read-later", [QUERY, {"content": "Looked."}], tools=["query_order"])
    if later == "after approval":
        agent.approval_policy = {"query_order": "always"}
        agent.save(update_fields=["approval_policy"])
    else:  # the slice ends right after the model turn; the next one runs the call
        monkeypatch.setattr(loop, "SLICE_STEPS", 1)
    run = start_run(agent=agent, user=demo["requester"], input="look")
    loop.advance(run.pk)
    assert ToolCall.objects.get(run=run).status == (
        ToolCallStatus.AWAITING_APPROVAL if later == "after approval" else ToolCallStatus.READY)
    Order.objects.filter(number=123).update(owner=demo["admin"])
    if later == "after approval":
        decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=demo["approver"], decision="approved",
                         comment="Go ahead.")
    loop.advance(run.pk)

    call = ToolCall.objects.get(run=run)
    assert checks == [("query_order", "assessed"), ("query_order", "rechecked")]
    assert call.status == ToolCallStatus.DENIED and "does not belong to the requester" in call.error
    told = json.loads(tool_messages(run.pk)[0])
    assert told["status"] == "denied"
    if later == "after approval":  # the approver's note still reaches the model
        assert told["approval"] == {"comment": "Go ahead."}


def test_a_side_effect_is_checked_again_in_the_same_slice(demo, worker, checks, payment_gateway):
    """Two refunds of one turn, each fine alone when proposed: the first leaves too little for the second."""
    Order.objects.create(number=9100, owner=demo["requester"], total="40.00")
    turn = {"tool_calls": [{"name": "refund", "arguments": {"order_id": 9100, "amount": 30}},
                           {"name": "refund", "arguments": {"order_id": 9100, "amount": 20}}]}
    agent = make_agent("two-refunds", [turn, {"content": "Done."}], tools=["refund"])
    run = start_run(agent=agent, user=demo["requester"], input="refund twice")
    worker.drain()

    first, second = ToolCall.objects.filter(run=run).order_by("id")
    assert checks == [("refund", "assessed")] * 2 + [("refund", "rechecked")] * 2
    assert first.status == ToolCallStatus.SUCCEEDED
    assert second.status == ToolCallStatus.DENIED and "at most 10.00" in second.error
    assert [r["amount"] for r in payment_gateway.ledger()["refunds"]] == ["30.00"]


def test_a_read_after_a_side_effect_of_the_same_slice_is_checked_again(demo, worker, checks, payment_gateway):
    """Refund first, then a read of the same turn: the refund may have changed what the read relies on."""
    Order.objects.create(number=9101, owner=demo["requester"], total="40.00")
    turn = {"tool_calls": [{"name": "refund", "arguments": {"order_id": 9101, "amount": 30}},
                           {"name": "query_order", "arguments": {"order_id": 9101}}]}
    agent = make_agent("refund-then-read", [turn, {"content": "Done."}], tools=["refund", "query_order"])
    run = start_run(agent=agent, user=demo["requester"], input="refund, then look")
    worker.drain()

    refund, read = ToolCall.objects.filter(run=run).order_by("id")
    assert checks == [("refund", "assessed"), ("query_order", "assessed"), ("refund", "rechecked"),
                      ("query_order", "rechecked")]
    assert refund.status == read.status == ToolCallStatus.SUCCEEDED
    assert read.result["refundable_amount"] == "10.00"


def test_a_read_after_another_writers_event_in_the_same_slice_is_checked_again(demo, idle_worker, monkeypatch, checks):
    """Input supplemented while the first read runs is another writer's event: the second read is re-checked."""
    from runs.engine.lifecycle import submit_input

    reads = {"tool_calls": [{"name": "query_order", "arguments": {"order_id": 123}},
                            {"name": "query_order", "arguments": {"order_id": 124}}]}
    agent = make_agent("two-reads", [reads, {"content": "Looked."}], tools=["query_order"])
    run = start_run(agent=agent, user=demo["requester"], input="look at both")
    tool = registry.get_tool("query_order")

    session = run.session  # read here: the handler runs on an event loop

    async def handler(ctx, arguments):
        if arguments["order_id"] == 123:
            await sync_to_async(submit_input)(agent=agent, user=demo["requester"], input="quickly please",
                                              session=session, multitask_strategy="supplement")
        return await tool.handler(ctx, arguments)

    monkeypatch.setitem(registry._TOOLS, "query_order", dataclasses.replace(tool, handler=handler))
    loop.advance(run.pk)

    assert checks == [("query_order", "assessed")] * 2 + [("query_order", "rechecked")]
    assert [c.status for c in ToolCall.objects.filter(run=run).order_by("id")] == [ToolCallStatus.SUCCEEDED] * 2


def test_an_approved_calls_note_is_told_alongside_calls_that_never_asked(demo, idle_worker):
    """Results delivered together: the calls that never asked skip the note lookup, the approved one keeps it."""
    from tools.services import deliver_tool_results

    refund = {"name": "refund", "arguments": {"order_id": 123, "amount": 70}}
    agent = make_agent("mixed-notes", [{"tool_calls": [refund]}, QUERY, {"content": "Done."}],
                       tools=["refund", "query_order"], check="refund")
    run = start_run(agent=agent, user=demo["requester"], input="refund then look")
    loop.advance(run.pk)
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=demo["approver"], decision="approved",
                     comment="Fine by me.")
    loop.advance(run.pk)
    approved, read = ToolCall.objects.filter(run=run).order_by("id")
    run.messages.filter(role="tool").delete()  # deliver both again, in one batch

    delivered = deliver_tool_results(run, never_asked=frozenset({read.pk}))

    told = {message.tool_call_id: json.loads(message.content) for message in delivered}
    assert told[approved.provider_call_id]["approval"] == {"comment": "Fine by me."}
    assert "approval" not in told[read.provider_call_id]


# --- idempotency keys: numbered after failures only where something deduplicates by them ------------


def test_only_deduplicated_calls_get_a_fresh_key_after_a_failure(people, worker, monkeypatch):
    lookup = {"name": "fake_lookup", "arguments": {"key": "a"}}
    transfer = {"name": "fake_transfer", "arguments": {"account": "acct-1", "amount": 5}}
    for name in ("fake_lookup", "fake_transfer"):  # each fails the first time it is sent
        tool = registry.get_tool(name)
        monkeypatch.setitem(registry._TOOLS, name, dataclasses.replace(tool, handler=_fails_once(tool.handler)))
    agent = make_agent("fail-then-succeed", [{"tool_calls": [lookup]}, {"tool_calls": [transfer]},
                                             {"tool_calls": [lookup]}, {"tool_calls": [transfer]},
                                             {"content": "Done."}], tools=["fake_lookup", "fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="twice each")
    worker.drain()

    lookups = list(ToolCall.objects.filter(run=run, name="fake_lookup").order_by("id"))
    sent = list(ToolCall.objects.filter(run=run, name="fake_transfer").order_by("id"))
    assert [c.status for c in lookups + sent] == ["failed", "succeeded"] * 2
    base = idempotency_key_base(registry.get_tool("fake_lookup"), run, {"key": "a"})
    assert [c.idempotency_key for c in lookups] == [base, base]  # reads are never deduplicated
    base = idempotency_key_base(registry.get_tool("fake_transfer"), run, {"account": "acct-1", "amount": 5})
    assert [c.idempotency_key for c in sent] == [base, f"{base}-1"]
    assert [t["transfer_id"] for t in transfers()] == [1] and sent[1].result["transfer_id"] == 1


def test_an_approved_edit_to_an_action_done_before_reuses_its_result(people, worker, monkeypatch):
    """The approver edits a transfer into one the session already made: its result is reused, nothing is sent."""
    small = {"name": "fake_transfer", "arguments": {"account": "acct-1", "amount": 5}}
    large = {"name": "fake_transfer", "arguments": {"account": "acct-1", "amount": 20}}
    sent = []
    tool = registry.get_tool("fake_transfer")
    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(
        tool, handler=lambda ctx, arguments: sent.append(ctx.idempotency_key) or tool.handler(ctx, arguments)))
    agent = make_agent("edit-to-done", [{"tool_calls": [small]}, {"tool_calls": [large]}, {"content": "Done."}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="transfer")
    worker.drain()
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved",
                     edited_arguments={"account": "acct-1", "amount": 5})
    worker.drain()

    first, second = ToolCall.objects.filter(run=run).order_by("id")
    assert (first.status, second.status) == (ToolCallStatus.SUCCEEDED, ToolCallStatus.SUCCEEDED)
    assert second.idempotency_key == first.idempotency_key and second.result == first.result
    assert sent == [first.idempotency_key] and len(transfers()) == 1
    assert run.events.filter(reason=f"reused result of call {first.pk}").exists()


def _fails_once(handler):
    """``handler``, raising ``ToolError`` the first time it is called."""
    calls = []

    def wrapped(ctx, arguments):
        calls.append(ctx.idempotency_key)
        if len(calls) == 1:
            raise ToolError("The first attempt failed.")
        return handler(ctx, arguments)
    return wrapped
