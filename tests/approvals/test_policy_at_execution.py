"""Policy is checked again just before a call runs (unless a read was assessed a moment ago), idempotency
keys after failures, and provider call ids cannot collide."""

import dataclasses
import json

import pytest

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.base.errors import InvalidInput
from runs.engine import loop
from runs.engine.lifecycle import start_run
from tests.support.api import tool_messages
from tests.support.durability import make_agent
from tests.support.core import lookup, transfer
from tests.support.fake_tools import hide_key, set_account_limit, transfers
from tools import registry
from tools.models import ToolCall, ToolCallStatus
from tools.registry import ToolError, ToolTimeout, ToolUnavailable
from tools.services import idempotency_key_base

LOOKUP = {"tool_calls": [lookup("acme")]}


def test_two_approved_transfers_cannot_exceed_the_accounts_limit(people, worker):
    agent = make_agent("double", [{"tool_calls": [transfer("acme", 70), transfer("acme", 60)]}, {"content": "Done."}],
                       tools=["fake_transfer"], check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="send to acme twice")
    worker.drain()
    for item in Interrupt.objects.filter(run=run):  # both passed the check when proposed
        decide_interrupt(interrupt=item, user=people["approver"], decision="approved")
    worker.drain()

    first, second = ToolCall.objects.filter(run=run).order_by("id")
    assert first.status == ToolCallStatus.SUCCEEDED
    assert second.status == ToolCallStatus.DENIED
    assert "at most 30.00" in second.error
    assert [t["amount"] for t in transfers()] == [70]


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
    """Wrap the fake tools' preconditions: ``checks`` lists ``(tool, "assessed" | "rechecked")`` per call."""
    seen: list[tuple[str, str]] = []

    def counted(name, precondition):
        def check(ctx, arguments):
            seen.append((name, "assessed" if ctx.tool_call is None else "rechecked"))
            return precondition(ctx, arguments)
        return check

    for name in ("fake_lookup", "fake_transfer"):
        tool = registry.get_tool(name)
        monkeypatch.setitem(registry._TOOLS, name, dataclasses.replace(
            tool, precondition=counted(name, tool.precondition)))
    return seen


def test_a_read_proposed_and_run_in_one_slice_is_not_checked_twice(people, worker, checks):
    agent = make_agent("read-now", [LOOKUP, {"content": "Looked."}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="look")
    worker.drain()

    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCallStatus.SUCCEEDED and call.result["key"] == "acme"
    assert checks == [("fake_lookup", "assessed")]
    assert json.loads(tool_messages(run.pk)[0]) == {"status": "succeeded", "result": call.result}


@pytest.mark.parametrize("later", ["next slice", "after approval"])
def test_a_read_picked_up_later_is_checked_again(people, idle_worker, monkeypatch, checks, later):
    """Between proposal and execution the key was hidden from the requester: the re-check denies the read."""
    agent = make_agent("read-later", [LOOKUP, {"content": "Looked."}], tools=["fake_lookup"])
    if later == "after approval":
        agent.approval_policy = {"fake_lookup": "always"}
        agent.save(update_fields=["approval_policy"])
    else:  # the slice ends right after the model turn; the next one runs the call
        monkeypatch.setattr(loop, "SLICE_STEPS", 1)
    run = start_run(agent=agent, user=people["requester"], input="look")
    loop.advance(run.pk)
    assert ToolCall.objects.get(run=run).status == (
        ToolCallStatus.AWAITING_APPROVAL if later == "after approval" else ToolCallStatus.READY)
    hide_key("acme")
    if later == "after approval":
        decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved",
                         comment="Go ahead.")
    loop.advance(run.pk)

    call = ToolCall.objects.get(run=run)
    assert checks == [("fake_lookup", "assessed"), ("fake_lookup", "rechecked")]
    assert call.status == ToolCallStatus.DENIED and "hidden from the requester" in call.error
    told = json.loads(tool_messages(run.pk)[0])
    assert told["status"] == "denied"
    if later == "after approval":  # the approver's note still reaches the model
        assert told["approval"] == {"comment": "Go ahead."}


def test_a_side_effect_is_checked_again_in_the_same_slice(people, worker, checks):
    """Two transfers of one turn, each fine alone when proposed: the first leaves too little for the second."""
    set_account_limit("acct-9100", 12)
    turn = {"tool_calls": [transfer("acct-9100", 9), transfer("acct-9100", 6)]}  # 10 or less: no approval
    agent = make_agent("two-transfers", [turn, {"content": "Done."}], tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send twice")
    worker.drain()

    first, second = ToolCall.objects.filter(run=run).order_by("id")
    assert checks == [("fake_transfer", "assessed")] * 2 + [("fake_transfer", "rechecked")] * 2
    assert first.status == ToolCallStatus.SUCCEEDED
    assert second.status == ToolCallStatus.DENIED and "at most 3.00" in second.error
    assert [t["amount"] for t in transfers()] == [9]


def test_a_read_after_a_side_effect_of_the_same_slice_is_checked_again(people, worker, checks):
    """Transfer first, then a read of the same turn: the transfer may have changed what the read relies on."""
    turn = {"tool_calls": [transfer("acct-9101", 9), lookup("acct-9101")]}
    agent = make_agent("transfer-then-read", [turn, {"content": "Done."}], tools=["fake_transfer", "fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="send, then look")
    worker.drain()

    sent, read = ToolCall.objects.filter(run=run).order_by("id")
    assert checks == [("fake_transfer", "assessed"), ("fake_lookup", "assessed"), ("fake_transfer", "rechecked"),
                      ("fake_lookup", "rechecked")]
    assert sent.status == read.status == ToolCallStatus.SUCCEEDED
    assert read.result["transferred"] == "9.00"


def test_a_read_after_another_writers_event_in_the_same_slice_is_checked_again(people, idle_worker, monkeypatch,
                                                                               checks):
    """Input supplemented while the first read runs is another writer's event: the second read is re-checked."""
    from runs.engine.lifecycle import submit_input

    reads = {"tool_calls": [lookup("a"), lookup("b")]}
    agent = make_agent("two-reads", [reads, {"content": "Looked."}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="look at both")
    tool = registry.get_tool("fake_lookup")

    session = run.session  # read here: the handler runs in the handler pool

    def handler(ctx, arguments):
        if arguments["key"] == "a":
            submit_input(agent=agent, user=people["requester"], input="quickly please", session=session,
                         multitask_strategy="supplement")
        return tool.handler(ctx, arguments)

    monkeypatch.setitem(registry._TOOLS, "fake_lookup", dataclasses.replace(tool, handler=handler))
    loop.advance(run.pk)

    assert checks == [("fake_lookup", "assessed")] * 2 + [("fake_lookup", "rechecked")]
    assert [c.status for c in ToolCall.objects.filter(run=run).order_by("id")] == [ToolCallStatus.SUCCEEDED] * 2


def test_an_approved_calls_note_is_told_alongside_calls_that_never_asked(people, idle_worker):
    """Results delivered together: the calls that never asked skip the note lookup, the approved one keeps it."""
    from tools.services import deliver_tool_results

    agent = make_agent("mixed-notes", [{"tool_calls": [transfer("acme", 70)]}, LOOKUP, {"content": "Done."}],
                       tools=["fake_transfer", "fake_lookup"], check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="send then look")
    loop.advance(run.pk)
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved",
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


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_approvers_edit_is_checked_by_the_precondition_as_the_engine_asks_it(people, worker, monkeypatch, kind):
    """A sync or ``async def`` precondition judges the edited arguments (the edit refused with its reason, the call
    still waiting); one that raises refuses the edit too (fail-safe); an edit it allows goes through."""
    tool = registry.get_tool("fake_transfer")

    def judge(ctx, arguments):
        if arguments["account"] == "broken":
            raise RuntimeError("the ledger is down")
        return "No transfers to globex." if arguments["account"] == "globex" else None

    async def ajudge(ctx, arguments):
        return judge(ctx, arguments)

    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(
        tool, approval="always", precondition=judge if kind == "sync" else ajudge))
    agent = make_agent("edit-checked", [{"tool_calls": [transfer("acme", 10)]}, {"content": "Done."}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="transfer")
    worker.drain()
    item = Interrupt.objects.get(run=run)

    for account, reason in (("globex", "No transfers to globex."),
                            ("broken", "The precondition could not be checked (RuntimeError).")):
        with pytest.raises(InvalidInput) as refused:
            decide_interrupt(interrupt=item, user=people["approver"], decision="approved",
                             edited_arguments={"account": account, "amount": 10})
        assert str(refused.value) == f"Edited arguments are not allowed: {reason}"
        item.refresh_from_db()
        assert item.status == "pending"

    decide_interrupt(interrupt=item, user=people["approver"], decision="approved",
                     edited_arguments={"account": "initech", "amount": 10})
    worker.drain()
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.arguments) == (ToolCallStatus.SUCCEEDED, {"account": "initech", "amount": 10})
    assert [t["account"] for t in transfers()] == ["initech"]


def _flaky_precondition(monkeypatch, name: str, schedule: list, **tool_fields) -> list:
    """Give tool ``name`` a precondition that, ask after ask, raises the next exception of ``schedule`` or, for a
    None there (and once it is used up), asks the real one; returns the asks' phases (``assessed`` at proposal,
    ``rechecked`` before sending)."""
    tool = registry.get_tool(name)
    asks, left = [], list(schedule)

    def flaky(ctx, arguments):
        asks.append("assessed" if ctx.tool_call is None else "rechecked")
        failure = left.pop(0) if left else None
        if failure is not None:
            raise failure
        return tool.precondition(ctx, arguments)

    monkeypatch.setitem(registry._TOOLS, name, dataclasses.replace(tool, precondition=flaky, backoff_s=0.01,
                                                                  **tool_fields))
    return asks


def test_a_precondition_that_fails_for_a_moment_is_asked_again_at_proposal_and_before_sending(
        people, worker, monkeypatch):
    """A transient failure (ToolUnavailable, ToolTimeout) is tried again after a short pause, as a read would be,
    so the call is judged on the answer, not denied for the outage."""
    asks = _flaky_precondition(monkeypatch, "fake_transfer",
                               [ToolUnavailable("ledger down"), ToolTimeout("slow"), None, ToolUnavailable("again")],
                               approval="always", max_attempts=3)
    agent = make_agent("flaky-check", [{"tool_calls": [transfer("acme", 10)]}, {"content": "Done."}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="transfer")
    worker.drain()
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.AWAITING_APPROVAL  # third try answered
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")
    worker.drain()

    assert asks == ["assessed"] * 3 + ["rechecked"] * 2  # before sending: one failure, then the answer
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.SUCCEEDED
    assert [t["amount"] for t in transfers()] == [10]


def test_a_precondition_that_keeps_failing_denies_after_the_tools_tries_and_a_bug_at_once(
        people, worker, monkeypatch):
    asks = _flaky_precondition(monkeypatch, "fake_transfer", [ToolUnavailable("down")] * 5, max_attempts=2)
    agent = make_agent("down-check", [{"tool_calls": [transfer("acme", 10)]}, {"content": "Done."}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="transfer")
    worker.drain()
    call = ToolCall.objects.get(run=run)
    assert asks == ["assessed", "assessed"]
    assert (call.status, call.error) == (ToolCallStatus.DENIED, "The precondition could not be checked (ToolUnavailable).")

    asks = _flaky_precondition(monkeypatch, "fake_lookup", [RuntimeError("a bug")], max_attempts=3)
    run = start_run(agent=make_agent("buggy-check", [LOOKUP, {"content": "Looked."}], tools=["fake_lookup"]),
                    user=people["requester"], input="look")
    worker.drain()
    assert asks == ["assessed"]  # not a transient failure: denied at once
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.DENIED
    assert transfers() == []


def test_an_edit_checked_while_the_precondition_is_down_is_refused_at_once(people, worker, monkeypatch):
    """An approver's request is not held for retries: the edit is refused, the item stays, and a later try
    (the precondition back) goes through."""
    asks = _flaky_precondition(monkeypatch, "fake_transfer", [], approval="always", max_attempts=3)
    agent = make_agent("edit-down", [{"tool_calls": [transfer("acme", 10)]}, {"content": "Done."}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="transfer")
    worker.drain()
    tool = registry.get_tool("fake_transfer")

    def down(ctx, arguments):
        asks.append("edit")
        raise ToolUnavailable("down")

    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(tool, precondition=down))
    item = Interrupt.objects.get(run=run)
    with pytest.raises(InvalidInput, match=r"could not be checked \(ToolUnavailable\)"):
        decide_interrupt(interrupt=item, user=people["approver"], decision="approved",
                         edited_arguments={"account": "acme", "amount": 9})
    assert asks == ["assessed", "edit"]
    monkeypatch.setitem(registry._TOOLS, "fake_transfer", tool)
    decide_interrupt(interrupt=item, user=people["approver"], decision="approved",
                     edited_arguments={"account": "acme", "amount": 9})
    worker.drain()
    assert [t["amount"] for t in transfers()] == [9]


def test_a_preconditions_pause_between_tries_is_never_longer_than_an_inline_backoff(monkeypatch, settings):
    """docs/design.md#the-loop: short backoffs are slept, longer ones wait ``retry_backoff`` holding no worker. A
    precondition's pause between two tries is slept on the loop (the run in flight, at proposal its model step
    started, before sending its target claimed), so it must stay within ``INLINE_BACKOFF_MAX_S``, whatever the
    tool's ``backoff_s`` (here a rate-limited API's 30 s: pauses of up to 30, 60 and 120 s)."""
    from tools.registry import ToolContext
    from tools.services import execution

    tool = dataclasses.replace(registry.get_tool("fake_lookup"), backoff_s=30, max_attempts=4)
    monkeypatch.setattr(execution, "full_jitter", lambda base_s, attempt: base_s * 2 ** (attempt - 1))  # its top
    steps = execution.check_precondition(tool, ToolContext(run=None, user=None), {"key": "acme"})
    next(steps)  # the first try
    pause = steps.throw(ToolUnavailable("rate limited"))
    assert pause.what == "pause"
    sleeping = pause.start()
    delay = sleeping.cr_frame.f_locals["delay"]
    sleeping.close()
    steps.close()
    assert delay <= settings.TOLLGATE["INLINE_BACKOFF_MAX_S"]
