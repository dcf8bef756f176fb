"""One fenced UPDATE per transaction reserves its events' seqs and writes its run columns.

``runs.services.append_events`` adds N to the run's counter and writes the
caller's run columns in one statement (fenced by the worker's lease), then
inserts the N events at once; ``runs.transitions.apply`` builds on it, and a
proposal stores each call already in its assessed status while the log
still says ``proposed`` first.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import lease
from runs.engine.lifecycle import start_run
from runs.lease import LeaseLost
from runs.models import Agent, Phase, Run, RunEvent, Step
from runs.services import Event, RunColumns, append_events
from runs.transitions import apply
from runs.webhooks.models import OutboxEntry, WebhookSubscription
from tests.support.core import transfer
from tests.support.durability import lookup_agent
from tools.models import ToolCall, ToolCallStatus
from runs.base.awaiting import drive
from tools.services import assess_tool_calls, propose_tool_calls
from tools.services.assessment import Assessed

pytestmark = pytest.mark.django_db(transaction=True)
S = ToolCallStatus


@pytest.fixture
def run(people):
    return start_run(agent=lookup_agent(), user=people["requester"], input="look a up")


def _taken_over(run_id: int) -> tuple[lease.Lease, lease.Lease]:
    """(the stale lease of a worker that stalled past its TTL, the lease of the worker that took over)."""
    stale = lease.acquire(run_id, owner="worker-a")
    Run.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return stale, lease.acquire(run_id, owner="worker-b")


def _run_row_writes(captured) -> list[str]:
    """Statements writing a run row: an UPDATE, or on PostgreSQL the one that also inserts the events."""
    return [q["sql"] for q in captured.captured_queries if 'UPDATE "runs_run"' in q["sql"]]


def _event_inserts(captured) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if 'INSERT INTO "runs_runevent"' in q["sql"]]


def test_run_columns_are_written_with_the_events_seqs_in_one_fenced_statement_or_not_at_all(run):
    stale, fresh = _taken_over(run.pk)
    before = Run.objects.get(pk=run.pk)
    columns = RunColumns(values={"phase": Phase.EXECUTING_TOOLS},
                         increments={"model_calls": 1, "cost_usd": Decimal("0.0125")})
    notes = [Event(type="note", actor="worker", reason="first"), Event(type="note", actor="worker", reason="second")]

    with lease.holding(stale), pytest.raises(LeaseLost), transaction.atomic():
        append_events(Run.objects.get(pk=run.pk), notes, columns=columns)
    after_refusal = Run.objects.get(pk=run.pk)
    assert (after_refusal.phase, after_refusal.model_calls, after_refusal.cost_usd, after_refusal.last_event_seq) == (
        before.phase, before.model_calls, before.cost_usd, before.last_event_seq)
    assert not run.events.filter(type="note").exists()

    mine = Run.objects.get(pk=run.pk)
    with lease.holding(fresh), CaptureQueriesContext(connection) as captured, transaction.atomic():
        events = append_events(mine, notes, columns=columns)
    assert len(_run_row_writes(captured)) == 1
    assert len(_event_inserts(captured)) == 1
    stored = Run.objects.get(pk=run.pk)
    assert stored.phase == Phase.EXECUTING_TOOLS
    assert stored.model_calls == before.model_calls + 1
    assert stored.cost_usd == before.cost_usd + Decimal("0.0125")
    assert stored.last_event_seq == before.last_event_seq + 2
    assert [(e.seq, e.reason) for e in events] == [(before.last_event_seq + 1, "first"),
                                                    (before.last_event_seq + 2, "second")]
    assert list(run.events.filter(type="note").values_list("pk", "seq")) == [(e.pk, e.seq) for e in events]
    # The instance mirrors the row: the values, the added amounts and its own unbroken series of seqs.
    assert (mine.phase, mine.last_event_seq, mine.model_calls, mine.cost_usd) == (
        Phase.EXECUTING_TOOLS, before.last_event_seq + 2, before.model_calls + 1, before.cost_usd + Decimal("0.0125"))


def test_every_event_of_one_reservation_reaches_the_webhook_outbox(people):
    WebhookSubscription.objects.create(owner=people["admin"], url="https://hooks.example.test/in",
                                       event_types=["run.waiting", "run.failed"], secret="whsec_test")
    run = start_run(agent=lookup_agent(), user=people["requester"], input="look a up")
    with transaction.atomic():
        events = append_events(run, [
            Event(type="transition", actor="test", from_status="running", to_status="waiting"),
            Event(type="note", actor="test"),  # no webhook type: not recorded
            Event(type="transition", actor="test", from_status="waiting", to_status="failed"),
        ])
    assert sorted(OutboxEntry.objects.values_list("event_id", flat=True)) == [events[0].pk, events[2].pk]
    assert [e.pk for e in RunEvent.objects.filter(run=run, seq__gte=events[0].seq).order_by("seq")] == [
        e.pk for e in events]


def test_the_event_counter_cannot_be_written_as_a_run_column():
    with pytest.raises(TypeError):
        RunColumns(increments={"last_event_seq": 5})


def test_a_proposal_stores_each_call_once_in_its_assessed_status_and_logs_proposed_first(people):
    agent = Agent.objects.create(slug="proposing", name="proposing", tools=["fake_lookup", "fake_transfer"],
                                 model={"provider": "scripted", "turns": []})
    run = start_run(agent=agent, user=people["requester"], input="send 80 to acme")
    step = Step.objects.create(run=run, index=0, request={})
    calls = [{"id": "c1", "name": "fake_lookup", "arguments": {"key": "acme"}},
             {"id": "c2", "name": "fake_transfer", "arguments": {"account": "acme", "amount": 80}},  # over 10: asks
             {"id": "c3", "name": "no_such_tool", "arguments": {}}]
    assessments = drive(assess_tool_calls(run=run, calls=calls, truncated=False))
    start = Run.objects.get(pk=run.pk).last_event_seq

    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        created = propose_tool_calls(run=run, step=step, calls=calls, assessments=assessments)

    assert [a.outcome for a in assessments] == [Assessed.MAKE_READY, Assessed.REQUEST_APPROVAL, Assessed.INVALIDATE]
    assert [c.status for c in created] == [S.READY, S.AWAITING_APPROVAL, S.INVALID]
    assert created[2].error == assessments[2].reason  # an invalid call keeps the assessment's reason as its error
    assert list(ToolCall.objects.filter(run=run).order_by("index").values_list("status", flat=True)) == [
        S.READY, S.AWAITING_APPROVAL, S.INVALID]
    statements = [q["sql"] for q in captured.captured_queries]
    assert len([sql for sql in statements if sql.startswith('INSERT INTO "tools_toolcall"')]) == 3
    assert not [sql for sql in statements if sql.startswith('UPDATE "tools_toolcall"')]
    assert len(_run_row_writes(captured)) == 3  # one reservation per call, for its two events
    events = list(run.events.filter(seq__gt=start).order_by("seq"))
    assert [e.seq for e in events] == list(range(start + 1, start + 7))
    assert [(e.type, e.payload["tool_call"], e.from_status, e.to_status) for e in events] == [
        ("tool_call", created[0].pk, "", S.PROPOSED), ("tool_call", created[0].pk, S.PROPOSED, S.READY),
        ("tool_call", created[1].pk, "", S.PROPOSED), ("tool_call", created[1].pk, S.PROPOSED, S.AWAITING_APPROVAL),
        ("tool_call", created[2].pk, "", S.PROPOSED), ("tool_call", created[2].pk, S.PROPOSED, S.INVALID)]
    assert [e.reason for e in events[::2]] == ["proposed"] * 3


def test_every_assessed_outcome_but_duplicate_is_a_tool_call_transition():
    transitions = {name for name in dir(ToolCall) if hasattr(getattr(ToolCall, name), "_django_fsm")}
    assert set(Assessed) - {Assessed.DUPLICATE} <= transitions


def test_a_new_call_whose_events_the_fence_refuses_is_not_stored_and_stays_unsaved(run):
    stale, _ = _taken_over(run.pk)
    step = Step.objects.create(run=run, index=0, request={})
    call = ToolCall(run=run, step=step, index=0, provider_call_id="c1", name="fake_lookup",
                    raw_arguments='{"key": "a"}', arguments={"key": "a"})
    with lease.holding(stale), pytest.raises(LeaseLost):
        apply(call.make_ready, actor="worker", reason="cleared",
              logged_before=lambda c: [Event(type="tool_call", actor="worker", reason="proposed",
                                             payload={"tool_call": c.pk}, to_status=S.PROPOSED)])
    assert not ToolCall.objects.filter(run=run).exists()
    assert not run.events.filter(type="tool_call").exists()
    assert (call.pk, call._state.adding, call.status) == (None, True, S.PROPOSED)


def test_a_runs_own_transition_is_written_by_its_events_update(run):
    held = lease.acquire(run.pk, owner="worker-a")
    mine = Run.objects.get(pk=run.pk)
    with lease.holding(held), CaptureQueriesContext(connection) as captured:
        apply(mine.start, actor="worker")
    assert len(_run_row_writes(captured)) == 1
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.phase, stored.started_at, stored.updated_at) == (
        mine.status, mine.phase, mine.started_at, mine.updated_at)
    assert stored.status == "running" and stored.started_at is not None and stored.updated_at > run.updated_at
    assert run.events.get(seq=stored.last_event_seq).to_status == "running"


def test_a_stale_copy_under_a_held_lease_is_refused_as_a_concurrent_transition(run):
    from django_fsm import ConcurrentTransition

    held = lease.acquire(run.pk, owner="worker-a")
    stale = Run.objects.get(pk=run.pk)
    apply(Run.objects.get(pk=run.pk).cancel, actor="user:requester")  # a person, no lease
    seq = Run.objects.get(pk=run.pk).last_event_seq
    with lease.holding(held), pytest.raises(ConcurrentTransition):
        apply(stale.start, actor="worker")
    assert (stale.status, stale.started_at) == ("queued", None), "left as it was loaded"
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.last_event_seq) == ("cancelled", seq)


def test_a_status_cannot_be_written_around_the_state_machine(run):
    with pytest.raises(TypeError), transaction.atomic():
        append_events(run, [Event(type="note", actor="x")], columns=RunColumns(values={"status": "completed"}))
    assert Run.objects.get(pk=run.pk).status == "queued"


# --- a decision's three transitions share one reservation (runs.transitions.EventBatch) ---------------

def _waiting_for(people, *accounts: str) -> Run:
    """A run of ``fake_transfer`` waiting for approval of one transfer (of 60, over the approval threshold) per
    account given."""
    from runs.engine import loop

    calls = [transfer(account, 60) for account in accounts]
    agent = Agent.objects.create(slug=f"batch-{accounts[0]}", name="batch", tools=["fake_transfer"],
                                 model={"provider": "scripted", "turns": [{"tool_calls": calls}, {"content": "Done."}]})
    run = start_run(agent=agent, user=people["requester"], input="send")
    loop.advance(run.pk)
    run.refresh_from_db()
    assert (run.status, run.waiting_reason) == ("waiting", "approval")
    return run


def _log_since(run: Run, seq: int) -> list[tuple[int, str, str, str]]:
    return list(run.events.filter(seq__gt=seq).order_by("seq").values_list("seq", "type", "from_status", "to_status"))


def test_a_decision_logs_its_three_transitions_in_order_with_one_run_row_write(people, idle_worker):
    from approvals.models import Interrupt
    from approvals.services import decide_interrupt

    run = _waiting_for(people, "acct-7301")
    item = Interrupt.objects.get(run=run)
    with CaptureQueriesContext(connection) as captured:
        decide_interrupt(interrupt=item, user=people["approver"], decision="approved")
    assert len(_run_row_writes(captured)) == 1
    assert len(_event_inserts(captured)) == 1
    stored = Run.objects.get(pk=run.pk)
    s = run.last_event_seq
    assert _log_since(run, s) == [(s + 1, "interrupt", "pending", "resolved"),
                                  (s + 2, "tool_call", "awaiting_approval", "ready"),
                                  (s + 3, "transition", "waiting", "running")]
    assert stored.last_event_seq == s + 3 and stored.status == "running"


def test_a_decision_that_leaves_another_item_pending_still_logs_both_of_its_events(people, idle_worker):
    from approvals.models import Interrupt
    from approvals.services import decide_interrupt

    run = _waiting_for(people, "acct-7311", "acct-7312")
    first, second = Interrupt.objects.filter(run=run).order_by("pk")
    decide_interrupt(interrupt=first, user=people["approver"], decision="rejected", comment="no")
    s = run.last_event_seq
    assert _log_since(run, s) == [(s + 1, "interrupt", "pending", "resolved"),
                                  (s + 2, "tool_call", "awaiting_approval", "rejected")]
    assert Run.objects.get(pk=run.pk).status == "waiting"
    decide_interrupt(interrupt=second, user=people["approver"], decision="approved")
    assert [row[1:] for row in _log_since(run, s + 2)] == [("interrupt", "pending", "resolved"),
                                                            ("tool_call", "awaiting_approval", "ready"),
                                                            ("transition", "waiting", "running")]


def test_a_refused_run_transition_undoes_the_batched_item_and_call(people, idle_worker, monkeypatch):
    from django_fsm import ConcurrentTransition

    from approvals.models import Interrupt
    from approvals.services import decide_interrupt

    run = _waiting_for(people, "acct-7321")
    item = Interrupt.objects.get(run=run)
    # another writer moves the run between the decision's lock and its run transition
    import runs.services as services
    reserve = services._reserve

    def moved_first(run_, count, columns, **keywords):
        Run.objects.filter(pk=run_.pk).update(status="cancelled")
        return reserve(run_, count, columns, **keywords)

    monkeypatch.setattr(services, "_reserve", moved_first)
    with pytest.raises(ConcurrentTransition):
        decide_interrupt(interrupt=item, user=people["approver"], decision="approved")
    monkeypatch.undo()
    assert Interrupt.objects.get(pk=item.pk).status == "pending"
    assert ToolCall.objects.get(run=run).status == "awaiting_approval"
    assert Run.objects.get(pk=run.pk).status == "waiting"
    assert not run.events.filter(seq__gt=run.last_event_seq).exists()


def test_an_event_batch_takes_its_own_run_instance_only_and_logs_nothing_when_left_by_an_error(run, people):
    from runs.transitions import EventBatch

    other = start_run(agent=lookup_agent("lookup-other"), user=people["requester"], input="another")
    seq = Run.objects.get(pk=run.pk).last_event_seq
    for stranger in (other, Run.objects.get(pk=run.pk)):  # another run; the same run through another instance
        with pytest.raises(TypeError), transaction.atomic():
            with EventBatch(run) as batch:
                batch.keep(run, Event(type="note", actor="test"))
                batch.keep(stranger, Event(type="note", actor="test"))
        assert Run.objects.get(pk=run.pk).last_event_seq == seq and not run.events.filter(type="note").exists()
    with transaction.atomic(), EventBatch(run) as batch:
        batch.keep(run, Event(type="note", actor="test", reason="kept"))
    assert list(run.events.filter(type="note").values_list("seq", "reason")) == [(seq + 1, "kept")]


def test_a_batch_is_refused_where_a_caught_error_could_log_a_transition_that_never_happened(people, idle_worker):
    from approvals.models import Interrupt
    from runs.transitions import EventBatch

    run = _waiting_for(people, "acct-7331")
    item = Interrupt.objects.select_related("run", "tool_call").get(run=run)
    call = item.tool_call
    call.run = item.run
    seq = item.run.last_event_seq
    with transaction.atomic(), EventBatch(item.run) as batch:
        with pytest.raises(TypeError):  # with a savepoint, a caller could catch a refused save and go on
            apply(call.reject, actor="test", error="no", batch=batch)
        with pytest.raises(TypeError):  # nothing would log these with a deferred event
            apply(call.reject, actor="test", error="no", batch=batch, savepoint=False,
                  columns=RunColumns(values={"phase": Phase.EXECUTING_TOOLS}))
    assert ToolCall.objects.get(pk=call.pk).status == "awaiting_approval"
    assert Run.objects.get(pk=run.pk).last_event_seq == seq


def test_a_batchs_rows_ride_on_its_reservation_and_a_read_in_between_sees_them(people, idle_worker):
    """The item's and the call's rows are written with the run's transition (on PostgreSQL in its one
    statement), but a statement run before it writes them first: a read in the block sees them stored."""
    from approvals.models import Interrupt
    from runs.tx import locked
    from tools.services import approve_tool_call

    run = _waiting_for(people, "acct-7341")
    item = Interrupt.objects.select_related("tool_call").get(run=run)
    wrappers = list(connection.execute_wrappers)
    with CaptureQueriesContext(connection) as captured, locked(run.pk) as tx:
        item.run = item.tool_call.run = tx.run
        tx.apply(item.resolve, actor="test", reason="approved", decision="approved", user=people["approver"],
                 comment="", edited_arguments=None, now=timezone.now())
        kept = len(captured)
        seen = Interrupt.objects.values_list("status", flat=True).get(pk=item.pk)  # writes the item first
        written_first = len(captured) - kept
        approve_tool_call(tx, item.tool_call, arguments=None, action_key="", actor="test")
        tx.apply(tx.run.resume, actor="test", reason="resumed")
    assert seen == "resolved" and written_first == 2  # the item's UPDATE, then the read
    updates = [q["sql"] for q in captured.captured_queries if q["sql"].startswith('UPDATE "tools_toolcall"')]
    assert updates == ([] if connection.vendor == "postgresql" else updates[:1])  # PostgreSQL: in the WITH
    assert ToolCall.objects.get(pk=item.tool_call_id).status == ToolCallStatus.READY
    assert Run.objects.get(pk=run.pk).status == "running"
    assert connection.execute_wrappers == wrappers


@pytest.mark.skipif(connection.vendor != "postgresql", reason="another session writing meanwhile: SQLite serializes writers")
@pytest.mark.parametrize("written", ["by the reservation", "first"])
def test_a_batchs_row_changed_behind_it_refuses_the_whole_block(people, idle_worker, written):
    """A kept row no longer holding what it was loaded with refuses the block, nothing of it written, whether
    the reservation's statement writes it or a statement before that does."""
    import threading

    from django_fsm import ConcurrentTransition

    from approvals.models import Interrupt
    from runs.tx import locked
    from tools.services import approve_tool_call

    run = _waiting_for(people, "acct-7351")
    item = Interrupt.objects.select_related("tool_call").get(run=run)
    seq = Run.objects.get(pk=run.pk).last_event_seq
    wrappers = list(connection.execute_wrappers)

    def changed_elsewhere():  # another session, committed: the call's row no longer holds its loaded status
        ToolCall.objects.filter(pk=item.tool_call_id).update(status=ToolCallStatus.REJECTED)
        connection.close()

    with pytest.raises(ConcurrentTransition), locked(run.pk) as tx:
        item.run = item.tool_call.run = tx.run
        approve_tool_call(tx, item.tool_call, arguments=None, action_key="", actor="test")
        thread = threading.Thread(target=changed_elsewhere)
        thread.start()
        thread.join()
        if written == "first":
            Run.objects.count()
        tx.apply(tx.run.resume, actor="test", reason="resumed")
    assert connection.execute_wrappers == wrappers
    assert Run.objects.get(pk=run.pk).last_event_seq == seq and Run.objects.get(pk=run.pk).status == "waiting"
    assert Interrupt.objects.get(pk=item.pk).status == "pending"


def test_an_error_in_a_block_drops_what_its_batch_kept(people, idle_worker):
    from approvals.models import Interrupt
    from runs.tx import locked

    run = _waiting_for(people, "acct-7361")
    item = Interrupt.objects.get(run=run)
    wrappers = list(connection.execute_wrappers)
    with pytest.raises(RuntimeError), locked(run.pk) as tx:
        item.run = tx.run
        tx.apply(item.resolve, actor="test", reason="approved", decision="approved", user=people["approver"],
                 comment="", edited_arguments=None, now=timezone.now())
        raise RuntimeError("the writer gives up")
    assert connection.execute_wrappers == wrappers
    assert Interrupt.objects.get(pk=item.pk).status == "pending"
    Run.objects.count()  # a statement after the block writes nothing kept
    assert Interrupt.objects.get(pk=item.pk).status == "pending"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="another session writing meanwhile: SQLite serializes writers")
@pytest.mark.parametrize("behind", ["changed", "gone"])
def test_of_two_kept_rows_the_refused_one_is_the_one_named(people, idle_worker, behind):
    """Two kept rows ride on the reservation (the item's, then the call's); the call's row changed (or was
    deleted) behind the batch. The statement wrote the item's row before refusing the call's: the error names
    the call (``ConcurrentTransition``, or ``DatabaseError`` when it is gone), not the item."""
    import threading

    from django.db import DatabaseError, connections
    from django_fsm import ConcurrentTransition

    from approvals.models import Interrupt
    from runs.tx import locked
    from tools.services import approve_tool_call

    run = _waiting_for(people, "acct-7371")
    item = Interrupt.objects.select_related("tool_call").get(run=run)

    def elsewhere():  # another session, committed
        with connections["default"].cursor() as cursor:
            if behind == "changed":
                cursor.execute("UPDATE tools_toolcall SET status = %s WHERE id = %s",
                               [ToolCallStatus.REJECTED, item.tool_call_id])
            else:  # gone (FK triggers off in this session only, so that nothing else goes with it)
                cursor.execute("SET session_replication_role = replica")
                cursor.execute("DELETE FROM tools_toolcall WHERE id = %s", [item.tool_call_id])
                cursor.execute("SET session_replication_role = DEFAULT")
        connections["default"].close()

    expected = ConcurrentTransition if behind == "changed" else DatabaseError
    with pytest.raises(expected) as raised, locked(run.pk) as tx:
        item.run = item.tool_call.run = tx.run
        tx.apply(item.resolve, actor="test", reason="approved", decision="approved", user=people["approver"],
                 comment="", edited_arguments=None, now=timezone.now())
        approve_tool_call(tx, item.tool_call, arguments=None, action_key="", actor="test")
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        tx.apply(tx.run.resume, actor="test", reason="resumed")
    assert "ToolCall" in str(raised.value)


def test_a_block_that_keeps_a_row_inside_an_execute_wrapper_context_still_commits(people, idle_worker):
    """``connection.execute_wrapper()`` pops the last wrapper on exit: a row kept inside such a context and
    written after it still commits, and both wrappers are gone afterwards."""
    from approvals.models import Interrupt
    from runs.tx import locked

    run = _waiting_for(people, "acct-7381")
    item = Interrupt.objects.get(run=run)
    wrappers = list(connection.execute_wrappers)
    seen = []

    def noting(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with locked(run.pk) as tx:
        item.run = tx.run
        with connection.execute_wrapper(noting):
            tx.apply(item.resolve, actor="test", reason="approved", decision="approved", user=people["approver"],
                     comment="", edited_arguments=None, now=timezone.now())
    assert connection.execute_wrappers == wrappers
    assert Interrupt.objects.get(pk=item.pk).status == "resolved"
