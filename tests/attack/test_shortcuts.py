"""Attacks on the worker's hot-path shortcuts: what the loop knows stands in for a read only while no one
else wrote, and a worker that lost its lease writes nothing, whichever shortcut it is on.

* ``Known.assessed_here``: a read proposed ``ready`` in this slice runs without its precondition checked
  again; a read that asked a person, or whose lease moved, must not take that path.
* ``lifecycle.ending_reads``: the final answer's ending takes the loop's calls and history when the run's
  event counter is unchanged; another writer in the completion check's window, or a lease taken over
  there, must send it down the full path or stop it.
"""

import dataclasses
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs import lease
from runs.engine import completion, loop
from runs.engine.lifecycle import cancel_run, start_run, submit_input
from runs.lease import LeaseLost
from runs.models import Message, MultitaskStrategy, Run, RunEvent, RunStatus
from tests.support.api import tool_messages
from tests.support.core import lookup
from tests.support.durability import make_agent
from tests.support.fake_tools import hide_key
from tools import registry
from tools.models import ToolCall, ToolCallStatus

S = ToolCallStatus
QUERY = {"tool_calls": [lookup("a")]}


def _gapless(run_id: int) -> list[int]:
    """The run's event seqs, asserted to be 1..N with N the run's counter; returns them."""
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert Run.objects.get(pk=run_id).last_event_seq == len(seqs)
    return seqs


def _take_over(run_id: int, owner: str = "worker-b") -> lease.Lease:
    """Another worker takes the lease of a worker that stalled past its TTL (no event is logged).

    The stalled worker's lease keeper still runs in this process and may renew the lease between its
    expiry and the takeover; then the lease is expired again (a real takeover comes once renewals stop).
    """
    for _ in range(5):
        Run.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        taken = lease.acquire(run_id, owner=owner)
        if taken is not None:
            return taken
    raise AssertionError(f"run {run_id}: its lease could not be taken over")


def _during_completion_check(monkeypatch, action) -> None:
    """Run ``action(run_id)`` once, right after the completion check judged a final answer (the answer is
    committed; the ending's transaction has not begun)."""
    evaluate = completion.evaluate
    pending = [action]

    def evaluate_then_act(run):
        verdict = evaluate(run)
        if pending:
            pending.pop()(run.pk)
        return verdict

    monkeypatch.setattr(completion, "evaluate", evaluate_then_act)


# --- lifecycle.ending_reads: the ending of a final answer --------------------------------------------


def test_a_lease_taken_over_during_the_completion_check_leaves_the_ending_unwritten(idle_worker, people,
                                                                                   monkeypatch):
    """The counter is unchanged (a takeover logs nothing), so the ending takes the loop's knowledge; its
    fenced write is refused and nothing of the ending lands. The new holder then ends the run once."""
    agent = make_agent("late-lease", [{"content": "Done."}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="question")
    taken = []
    seen = {}

    def take_over(run_id):
        seen["seq"] = Run.objects.get(pk=run_id).last_event_seq
        taken.append(_take_over(run_id))

    _during_completion_check(monkeypatch, take_over)
    with pytest.raises(LeaseLost):
        loop.advance(run.pk)

    stale = Run.objects.get(pk=run.pk)
    assert stale.status == RunStatus.RUNNING and stale.outcome == "" and stale.final_output == ""
    assert stale.last_event_seq == seen["seq"], "the lease loser logged something"
    assert stale.lease_token == taken[0].token
    lease.release(taken[0])

    loop.advance(run.pk)  # the next holder judges the stored answer and ends the run
    run.refresh_from_db()
    assert (run.status, run.outcome, run.final_output) == (RunStatus.COMPLETED, "achieved", "Done.")
    assert run.events.filter(to_status=RunStatus.COMPLETED).count() == 1
    assert run.messages.filter(role="assistant").count() == 1
    _gapless(run.pk)


@pytest.mark.parametrize("writer", ["supplement", "cancel"])
def test_another_writer_during_the_completion_check_is_not_lost_by_the_ending(idle_worker, people, monkeypatch,
                                                                              writer):
    """Between the stored answer and the ending's lock: input supplemented must start the next run, a
    cancel must win. Either is another writer's event, so the ending must not take the loop's history."""
    agent = make_agent("late-writer", [{"content": "Done."}, {"content": "Next."}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="question")

    def write(run_id):
        if writer == "supplement":
            submit_input(agent=agent, user=people["requester"], input="PS: key b too", session=run.session,
                         multitask_strategy=MultitaskStrategy.SUPPLEMENT)
        else:
            cancel_run(run=Run.objects.get(pk=run_id), actor="user:requester")

    _during_completion_check(monkeypatch, write)
    loop.advance(run.pk)

    run.refresh_from_db()
    if writer == "cancel":
        assert run.status == RunStatus.CANCELLED and run.outcome == ""
        assert run.events.filter(reason="cancelled before the final answer was accepted").exists()
    else:
        assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
        event = run.events.get(type="input", reason__startswith="supplemented input was not read")
        following = Run.objects.get(pk=event.payload["run"])
        assert (following.input, following.status) == ("PS: key b too", RunStatus.QUEUED)
        assert Message.objects.filter(session=run.session, role="user").count() == 2
    _gapless(run.pk)


# --- Known.assessed_here: a read run without its precondition checked again ---------------------------


@pytest.fixture
def checks(monkeypatch):
    """Wrap fake_lookup's precondition and handler: ``checks`` lists ``"assessed"``, ``"rechecked"`` and
    ``"sent"`` in the order they happened."""
    seen: list[str] = []
    tool = registry.get_tool("fake_lookup")

    def precondition(ctx, arguments):
        seen.append("assessed" if ctx.tool_call is None else "rechecked")
        return tool.precondition(ctx, arguments)

    def handler(ctx, arguments):
        seen.append("sent")
        return tool.handler(ctx, arguments)

    monkeypatch.setitem(registry._TOOLS, "fake_lookup", dataclasses.replace(
        tool, precondition=precondition, handler=handler))
    return seen


def test_a_read_approved_within_the_slice_is_checked_again_before_it_runs(idle_worker, people, monkeypatch,
                                                                         checks):
    """A read that asked a person is never ``assessed_here``, even when the approval lands in the same
    slice (before the run would wait): the key was hidden from the requester meanwhile, so the read is denied."""
    agent = make_agent("read-approved-now", [QUERY, {"content": "Looked."}], tools=["fake_lookup"])
    agent.approval_policy = {"fake_lookup": "always"}
    agent.save(update_fields=["approval_policy"])
    run = start_run(agent=agent, user=people["requester"], input="look")
    wait_for_approval = loop._wait_for_approval

    def approved_first(run):
        hide_key("a")
        decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")
        return wait_for_approval(run)

    monkeypatch.setattr(loop, "_wait_for_approval", approved_first)
    loop.advance(run.pk)

    call = ToolCall.objects.get(run=run)
    assert checks == ["assessed", "rechecked"]
    assert call.status == S.DENIED and "is hidden from the requester" in call.error
    assert json.loads(tool_messages(run.pk)[0])["status"] == "denied"
    assert not run.events.filter(to_status=RunStatus.WAITING).exists()
    _gapless(run.pk)


def test_a_read_whose_lease_moved_before_it_ran_is_never_sent(idle_worker, people, monkeypatch, checks):
    """Proposed ``ready`` in this slice (no re-check on the way), then the lease changes hands without an
    event: the call's ``running`` is refused by the fence, so the handler is never called."""
    agent = make_agent("read-lease-moved", [QUERY, {"content": "Looked."}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="look")
    failpoint = loop.failpoint
    taken, seen = [], {}

    def takeover_at_ready(name, *details):
        if name == "tool_call_ready" and not taken:
            seen["seq"] = Run.objects.get(pk=run.pk).last_event_seq
            taken.append(_take_over(run.pk))
        return failpoint(name, *details)

    monkeypatch.setattr(loop, "failpoint", takeover_at_ready)
    with pytest.raises(LeaseLost):
        loop.advance(run.pk)

    call = ToolCall.objects.get(run=run)
    assert checks == ["assessed"], "the stale worker sent the read"
    assert (call.status, call.attempts, call.idempotency_key) == (S.READY, 0, "")
    assert Run.objects.get(pk=run.pk).last_event_seq == seen["seq"]
    lease.release(taken[0])

    loop.advance(run.pk)  # the next holder checks the read again (a new slice) and sends it once
    call.refresh_from_db()
    assert checks == ["assessed", "rechecked", "sent"]
    assert call.status == S.SUCCEEDED
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    _gapless(run.pk)


def test_a_read_whose_key_was_hidden_while_an_earlier_call_of_its_turn_ran_is_checked_again(
        idle_worker, people, monkeypatch):
    """Two reads of one turn, both allowed when proposed. While the first is out (a slow call, its retries,
    an inline backoff: seconds to minutes), another request hides key b from the requester. The
    second read was assessed before all that, not "a moment ago": its precondition (the requester's
    right to the key) must be checked again before it is sent, as before the shortcut."""
    reads = {"tool_calls": [lookup("a"), lookup("b")]}
    agent = make_agent("two-reads-revoked", [reads, {"content": "Looked."}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="look at both")
    tool = registry.get_tool("fake_lookup")
    seen: list[tuple[str, str]] = []

    def precondition(ctx, arguments):
        seen.append(("assessed" if ctx.tool_call is None else "rechecked", arguments["key"]))
        return tool.precondition(ctx, arguments)

    def handler(ctx, arguments):
        seen.append(("sent", arguments["key"]))
        if arguments["key"] == "a":  # meanwhile, another request: key b is hidden from the requester
            hide_key("b")
        return tool.handler(ctx, arguments)

    monkeypatch.setitem(registry._TOOLS, "fake_lookup", dataclasses.replace(
        tool, precondition=precondition, handler=handler))
    loop.advance(run.pk)

    first, second = ToolCall.objects.filter(run=run).order_by("id")
    assert first.status == S.SUCCEEDED
    assert ("sent", "b") not in seen, f"read of a key hidden from the requester was sent: {seen}"
    assert seen == [("assessed", "a"), ("assessed", "b"), ("sent", "a"), ("rechecked", "b")]
    assert second.status == S.DENIED and "is hidden from the requester" in second.error
    _gapless(run.pk)


# --- runs.services.append_events: an insert refused after the reservation -----------------------------


def test_an_event_insert_refused_after_the_reservation_leaves_the_instance_as_stored(people):
    """The reservation moved the instance's counter (and columns) before the INSERT was refused; the
    savepoint rolled the row back. A counter left ahead would later swallow another writer's event: the
    instance's next own event lands just above it, so the counters match while that event was never seen
    (``Known.revalidate`` and the ending's shortcut decide by that match)."""
    from django.db import transaction

    from runs.services import Event, RunColumns, append_event, append_events

    run = start_run(agent=make_agent("refused-insert", [], tools=[]), user=people["requester"], input="x")
    mine = Run.objects.get(pk=run.pk)
    start, calls = mine.last_event_seq, mine.model_calls
    with transaction.atomic():
        with pytest.raises(TypeError), transaction.atomic():  # a payload the INSERT cannot store
            append_events(mine, [Event(type="note", actor="worker", payload={"bad": object()})],
                          columns=RunColumns(increments={"model_calls": 1}))
    assert Run.objects.get(pk=run.pk).last_event_seq == start, "no seq reserved without its event"
    assert (mine.last_event_seq, mine.model_calls) == (start, calls), "the instance holds what was never stored"

    with transaction.atomic():
        append_event(Run.objects.get(pk=run.pk), type="note", actor="user:approver")  # another writer
    with transaction.atomic():
        append_event(mine, type="note", actor="worker")
    assert mine.last_event_seq != Run.objects.get(pk=run.pk).last_event_seq, "another writer's event is hidden"
    _gapless(run.pk)


def test_a_transition_refused_after_its_event_leaves_the_runs_instance_as_stored(people):
    """A step's answer the database cannot store fails its save after the event's reservation moved the
    run instance's counter and usage; the transition's own instance is put back, and so must the run be."""
    from django.db import transaction

    from runs.models import Step
    from runs.services import RunColumns
    from runs.transitions import apply

    run = start_run(agent=make_agent("refused-save", [], tools=[]), user=people["requester"], input="x")
    mine = Run.objects.get(pk=run.pk)
    step = Step.objects.create(run=mine, index=0, request={})
    start, calls = mine.last_event_seq, mine.model_calls
    with transaction.atomic():
        with pytest.raises(TypeError):
            apply(step.succeed, actor="worker", response={"bad": object()}, input_tokens=1, output_tokens=1,
                  cost_usd=0, now=timezone.now(), columns=RunColumns(increments={"model_calls": 1}))
    assert step.status == "started"
    assert Run.objects.get(pk=run.pk).last_event_seq == start
    assert (mine.last_event_seq, mine.model_calls) == (start, calls), "the run instance holds what was never stored"
    _gapless(run.pk)
