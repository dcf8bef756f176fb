"""The state machines of Run, Step, ToolCall and Interrupt, and the one helper that applies them.

Legal transitions work, illegal ones and refused guards raise and write
nothing; ``runs.transitions.apply`` logs one event per transition, saves
only what the transition changed, is fenced by the worker's lease, and
pushes each run touched in a transaction once, after commit.
"""

import asyncio
import contextlib
import re
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_fsm import ConcurrentTransition, TransitionNotAllowed, can_proceed

from approvals.models import Interrupt, InterruptKind
from runs import lease
from runs.engine.lifecycle import start_run
from runs.lease import LeaseLost
from runs.live import run_events_group, run_group
from runs.models import Run, RunStatus, Step
from runs.services import append_event, set_phase
from runs.transitions import apply
from tests.support.durability import lookup_agent
from tests.support.live import listening
from tools.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(people):
    return start_run(agent=lookup_agent(), user=people["requester"], input="look a up")


@pytest.fixture
def running(run):
    """The run started, with one model step in flight."""
    apply(run.start, actor="worker")
    return run, Step.objects.create(run=run, index=0)


def _columns_set(queries, table: str) -> list[list[str]]:
    """The columns each captured ``UPDATE <table> SET ...`` wrote, in order (an UPDATE in a ``WITH`` included:
    on PostgreSQL one statement reserves events' seqs, inserts them and writes another machine's row)."""
    written = []
    for query in queries:
        for assignments in re.findall(rf'UPDATE "{table}" SET (.*?) WHERE ', query["sql"]):
            written.append(re.findall(r'"(\w+)" = ', assignments))
    return written


# --- the machines -----------------------------------------------------------


def test_status_fields_cannot_be_assigned_directly(running):
    run, step = running
    with pytest.raises(AttributeError):
        run.status = RunStatus.COMPLETED
    with pytest.raises(AttributeError):
        step.status = Step.Status.SUCCEEDED


def test_queued_run_cannot_complete_without_running(run):
    with pytest.raises(TransitionNotAllowed):
        apply(run.complete, actor="test", outcome="achieved", final_output="done")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_terminal_runs_are_final(run):
    apply(run.fail, actor="test", failure_type="internal_error", error="boom")
    for transition, kwargs in [(run.start, {}), (run.resume, {}), (run.wake, {}), (run.cancel, {}),
                               (run.fail, {"failure_type": "model_error", "error": "x"})]:
        with pytest.raises(TransitionNotAllowed):
            apply(transition, actor="test", **kwargs)
    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "internal_error")
    assert run.finished_at is not None


def test_every_transition_is_logged_with_from_to_and_actor(run):
    apply(run.start, actor="worker")
    apply(run.wait, actor="worker", waiting_reason="approval")
    transitions = list(run.events.filter(type="transition").values_list("seq", "from_status", "to_status", "actor"))
    assert transitions == [
        (1, "", "queued", "user:requester"),
        (2, "queued", "running", "worker"),
        (3, "running", "waiting", "worker"),
    ]
    run.refresh_from_db()
    assert run.waiting_reason == "approval"
    assert run.events.get(seq=3).payload == {"waiting_reason": "approval"}


def test_a_stale_copy_of_a_run_cannot_overwrite_a_newer_status(run):
    stale = Run.objects.get(pk=run.pk)
    apply(run.cancel, actor="user:requester")
    with pytest.raises(ConcurrentTransition):
        apply(stale.start, actor="worker")
    assert (stale.status, stale.phase, stale.started_at) == (RunStatus.QUEUED, "", None), "left as it was loaded"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.events.filter(to_status=RunStatus.RUNNING).count() == 0


def test_tool_call_cannot_run_before_it_is_ready(run):
    step = Step.objects.create(run=run, index=0)
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id="c1", name="fake_transfer")
    with pytest.raises(TransitionNotAllowed):
        call.begin(idempotency_key="k", now=None)
    call.request_approval()
    with pytest.raises(TransitionNotAllowed):
        call.begin(idempotency_key="k", now=None)
    call.make_ready()
    call.begin(idempotency_key="k", now=None)
    assert call.status == ToolCallStatus.RUNNING


def test_resolved_interrupt_cannot_be_resolved_again(run, people):
    interrupt = Interrupt.objects.create(run=run, kind=InterruptKind.APPROVAL, title="t")
    interrupt.resolve(decision="approved", user=people["approver"], comment="", edited_arguments=None, now=None)
    with pytest.raises(TransitionNotAllowed):
        interrupt.resolve(decision="rejected", user=people["approver"], comment="", edited_arguments=None, now=None)
    with pytest.raises(TransitionNotAllowed):
        interrupt.cancel(now=None)


def test_a_step_ends_once(running):
    run, step = running
    apply(step.succeed, actor="worker", response={"content": "hi"}, input_tokens=3, output_tokens=1, cost_usd=0,
          now=timezone.now())
    for transition, kwargs in [(step.fail, {"error": "x"}), (step.discard, {}), (step.succeed, {
            "response": {}, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0})]:
        with pytest.raises(TransitionNotAllowed):
            apply(transition, actor="worker", now=timezone.now(), **kwargs)
    step.refresh_from_db()
    assert (step.status, step.response, step.input_tokens) == (Step.Status.SUCCEEDED, {"content": "hi"}, 3)
    event = run.events.get(type="model_call")
    assert (event.from_status, event.to_status, event.reason, event.payload) == (
        "started", "succeeded", "succeed", {"step": step.pk})


# --- guards (conditions=) -------------------------------------------------


def test_a_cancel_request_refuses_waiting_and_completing(running):
    run, _ = running
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    run.refresh_from_db()
    events_before = run.events.count()
    for transition, kwargs in [(run.wait, {"waiting_reason": "approval"}),
                               (run.complete, {"outcome": "achieved", "final_output": "done"})]:
        assert not can_proceed(transition)
        with pytest.raises(TransitionNotAllowed, match="conditions"):
            apply(transition, actor="worker", **kwargs)
    run.refresh_from_db()
    assert (run.status, run.waiting_reason, run.outcome) == (RunStatus.RUNNING, "", "")
    assert run.events.count() == events_before
    apply(run.cancel, actor="worker")  # what the loop does instead
    assert run.status == RunStatus.CANCELLED


def test_a_timer_wakes_a_run_and_only_a_decision_resumes_one_waiting_for_a_person(running):
    run, _ = running
    apply(run.wait, actor="worker", waiting_reason="approval")
    assert can_proceed(run.resume) and not can_proceed(run.wake), "no timer: only a decision moves it"
    apply(run.resume, actor="user:approver")
    apply(run.wait, actor="worker", waiting_reason="retry_backoff", wake_at=timezone.now() + timedelta(seconds=5))
    assert not can_proceed(run.resume), "nobody is asked: a decision has nothing to resume"
    with pytest.raises(TransitionNotAllowed):
        apply(run.resume, actor="user:approver")
    apply(run.wake, actor="sweeper")
    run.refresh_from_db()
    assert (run.status, run.waiting_reason, run.wake_at) == (RunStatus.RUNNING, "", None)


def test_a_call_never_sent_cannot_become_unknown(running):
    run, step = running
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id="c1", name="refund", side_effect=True)
    apply(call.make_ready, actor="worker")
    with pytest.raises(TransitionNotAllowed):
        apply(call.mark_unknown, actor="worker", error="run ended")
    apply(call.begin, actor="worker", idempotency_key="k", now=timezone.now())
    apply(call.requeue, actor="worker", error="gateway unavailable")
    apply(call.mark_unknown, actor="worker", error="run ended after a send")  # sent once: it may have happened
    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.UNKNOWN


# --- the helper ---------------------------------------------------------------


def test_apply_saves_only_the_fields_the_transition_changed(running):
    run, step = running
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id="c1", name="refund",
                                   arguments={"order_id": 123})
    # Other writers change other fields meanwhile; the copies in memory do not know.
    ToolCall.objects.filter(pk=call.pk).update(reconcile_attempts=5, arguments={"order_id": 124})
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now(), input_tokens=7)

    with CaptureQueriesContext(connection) as queries:
        apply(call.request_approval, actor="worker")
        apply(run.fail, actor="worker", failure_type="internal_error", error="boom")

    assert _columns_set(queries, "tools_toolcall") == [["status"]]
    assert sorted(_columns_set(queries, "runs_run")[-1]) == sorted(  # with the event counter, in one UPDATE
        ["status", "failure_type", "error", "phase", "finished_at", "updated_at", "last_event_seq"])
    call.refresh_from_db()
    run.refresh_from_db()
    assert (call.status, call.reconcile_attempts, call.arguments) == ("awaiting_approval", 5, {"order_id": 124})
    assert (run.status, run.input_tokens, run.cancel_requested_at is not None) == ("failed", 7, True)


def test_another_machines_row_rides_on_its_event_and_a_row_changed_meanwhile_writes_nothing(running):
    run, step = running
    call, other = [ToolCall.objects.create(run=run, step=step, index=index, provider_call_id=f"c{index}",
                                           name="fake_lookup", arguments={"key": "a"}) for index in (0, 1)]
    with CaptureQueriesContext(connection) as queries:
        apply(call.request_approval, actor="worker")
    writes = [q["sql"] for q in queries if 'UPDATE "tools_toolcall"' in q["sql"]]
    assert len(writes) == 1
    if connection.vendor == "postgresql":  # the run's row, the event and the call's row: one statement
        assert 'INSERT INTO "runs_runevent"' in writes[0] and writes[0].startswith('WITH written AS (UPDATE "runs_run"')
    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.AWAITING_APPROVAL
    assert run.events.filter(payload__tool_call=call.pk, to_status=ToolCallStatus.AWAITING_APPROVAL).exists()

    ToolCall.objects.filter(pk=other.pk).update(status=ToolCallStatus.DENIED)  # another writer, meanwhile
    seq = Run.objects.get(pk=run.pk).last_event_seq
    with pytest.raises(ConcurrentTransition):
        apply(other.request_approval, actor="worker")
    assert Run.objects.get(pk=run.pk).last_event_seq == seq == run.last_event_seq
    assert not run.events.filter(payload__tool_call=other.pk).exists()
    assert ToolCall.objects.get(pk=other.pk).status == ToolCallStatus.DENIED
    assert other.status == ToolCallStatus.PROPOSED  # the instance is put back too


def test_apply_appends_one_event_per_transition_of_every_machine(running, people):
    run, step = running
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id="c1", name="refund")
    interrupt = Interrupt.objects.create(run=run, tool_call=call, kind=InterruptKind.APPROVAL, title="t")
    seq = run.events.count()

    apply(step.discard, actor="worker", reason="discarded: stream cut", error="cut", now=timezone.now())
    apply(call.request_approval, actor="worker", reason="approval rule: always")
    apply(interrupt.resolve, actor="user:approver", reason="approved", decision="approved", user=people["approver"],
          comment="fine", edited_arguments=None, now=timezone.now())
    apply(run.wait, actor="worker", waiting_reason="approval")

    events = list(run.events.filter(seq__gt=seq).order_by("seq").values_list(
        "type", "from_status", "to_status", "actor", "reason", "payload"))
    assert events == [
        ("model_call", "started", "discarded", "worker", "discarded: stream cut", {"step": step.pk}),
        ("tool_call", "proposed", "awaiting_approval", "worker", "approval rule: always",
         {"tool_call": call.pk, "name": "refund"}),
        ("interrupt", "pending", "resolved", "user:approver", "approved",
         {"interrupt": interrupt.pk, "kind": "approval", "decision": "approved", "comment": "fine",
          "allow_requester": True}),
        ("transition", "running", "waiting", "worker", "wait", {"waiting_reason": "approval"}),
    ]
    assert Run.objects.get(pk=run.pk).last_event_seq == seq + 4


def test_a_worker_whose_lease_was_taken_over_cannot_end_a_step(running):
    run, step = running
    stale = lease.acquire(run.pk, owner="worker-a")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    fresh = lease.acquire(run.pk, owner="worker-b")
    events_before = run.events.count()

    with lease.holding(stale):
        for transition, kwargs in [(step.succeed, {"response": {"content": "late"}, "input_tokens": 1,
                                                   "output_tokens": 1, "cost_usd": 0}),
                                   (step.fail, {"error": "late"}), (step.discard, {})]:
            with pytest.raises(LeaseLost):
                apply(transition, actor="worker-a", now=timezone.now(), **kwargs)
            assert (step.status, step.finished_at) == (Step.Status.STARTED, None), "left as it was"
    assert Step.objects.get(pk=step.pk).status == Step.Status.STARTED
    assert run.events.count() == events_before

    with lease.holding(fresh):  # the worker that holds the lease now discards it, as a takeover does
        apply(step.discard, actor="worker-b", reason="discarded after a worker crash", now=timezone.now())
    assert Step.objects.get(pk=step.pk).status == Step.Status.DISCARDED
    assert run.events.latest("seq").actor == "worker-b"


def test_a_transaction_pushes_each_run_it_touched_once_after_commit(running, people):
    run, step = running
    other = start_run(agent=run.agent, user=people["requester"], input="another")
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id="c1", name="refund")
    layer = get_channel_layer()

    def several_transitions_in_one_transaction():
        with CaptureQueriesContext(connection) as queries:
            with transaction.atomic():
                set_phase(run, "calling_model")
                apply(step.succeed, actor="worker", response={}, input_tokens=1, output_tokens=1, cost_usd=0,
                      now=timezone.now())
                apply(call.make_ready, actor="worker")
                apply(call.begin, actor="worker", idempotency_key="k", now=timezone.now())
                apply(run.wait, actor="worker", waiting_reason="approval")
                apply(other.cancel, actor="user:requester")
                pushed_before_commit = [q for q in queries if 'FROM "runs_run" WHERE "runs_run"."id" IN' in q["sql"]]
        snapshots = [q for q in queries if 'FROM "runs_run" WHERE "runs_run"."id" IN' in q["sql"]]
        return pushed_before_commit, snapshots

    async def receive_all(channel: str) -> list[dict]:
        messages = []
        while True:
            try:
                messages.append(await asyncio.wait_for(layer.receive(channel), 1))
            except asyncio.TimeoutError:
                return messages

    @async_to_sync
    async def scenario():
        # The fixture's and ``start_run``'s own pushes go out first: only this transaction's are received.
        channels = {run_id: await listening(layer, run_group(run_id)) for run_id in (run.pk, other.pk)}
        before_commit, snapshots = await database_sync_to_async(several_transitions_in_one_transaction)()
        assert before_commit == [], "nothing is pushed before the commit"
        assert snapshots == [], "the snapshots come from the instances the transaction changed"
        received = {run_id: await receive_all(channel) for run_id, channel in channels.items()}
        assert [m["run"]["status"] for m in received[run.pk]] == ["waiting"]
        assert [m["run"]["status"] for m in received[other.pk]] == ["cancelled"]
        assert received[run.pk][0]["run"]["phase"] == ""
        stored = await database_sync_to_async(lambda: dict(Run.objects.filter(pk__in=channels).values_list(
            "pk", "last_event_seq")))()
        assert {run_id: messages[0]["run"]["seq"] for run_id, messages in received.items()} == stored

    scenario()


def test_a_run_changed_through_two_instances_is_pushed_as_stored(running, people):
    """Neither instance holds both changes: the push reads the run back (one query) rather than guess."""
    run, _ = running
    layer = get_channel_layer()

    def two_instances_in_one_transaction():
        with CaptureQueriesContext(connection) as queries:
            with transaction.atomic():
                set_phase(run, "calling_model")
                apply(Run.objects.get(pk=run.pk).wait, actor="worker", waiting_reason="approval")
        return [q for q in queries if 'FROM "runs_run" WHERE "runs_run"."id" IN' in q["sql"]]

    @async_to_sync
    async def scenario():
        channel = await listening(layer, run_group(run.pk))  # the fixture's pushes went out: the first is ours
        snapshots = await database_sync_to_async(two_instances_in_one_transaction)()
        message = await asyncio.wait_for(layer.receive(channel), 5)
        assert len(snapshots) == 1
        assert (message["run"]["status"], message["run"]["waiting_reason"]) == ("waiting", "approval")
        stored = await database_sync_to_async(lambda: Run.objects.get(pk=run.pk).last_event_seq)()
        assert message["run"]["seq"] == stored

    scenario()


def test_a_commit_that_pushes_a_snapshot_sends_no_event_notice_and_one_that_only_logs_sends_one(run):
    """Event sockets hear the run's group too, so a snapshot (its ``seq``) is their notice; a commit that only
    logs events (no snapshot owed) sends the notice alone. The first notice heard is the later commit's."""
    layer = get_channel_layer()

    def commits():
        apply(run.start, actor="worker")  # a transition: a snapshot, seq 2
        with transaction.atomic():
            append_event(run, type="note", actor="system", reason="only logged")  # seq 3, no snapshot
        return run.last_event_seq

    @async_to_sync
    async def scenario():
        updates = await listening(layer, run_group(run.pk))
        notices = await listening(layer, run_events_group(run.pk))
        last = await database_sync_to_async(commits)()
        update = (await asyncio.wait_for(layer.receive(updates), 5))["run"]
        notice = await asyncio.wait_for(layer.receive(notices), 5)
        return update, notice, last

    update, notice, last = scenario()
    assert (update["status"], update["seq"]) == ("running", last - 1)
    assert notice == {"type": "run.event", "seq": last}


@pytest.mark.parametrize("rolled_back", ["transaction", "savepoint"])
def test_what_a_rollback_undid_is_never_pushed(running, people, rolled_back):
    """A run changed only in work that rolled back (a whole transaction, or a savepoint: a group commit's
    failed job) is not pushed with the thread's next commit: its instance holds a status and ``seq`` the
    database never had. The run's next push is what is stored (its ``seq`` is the event sockets' notice too:
    ``runs.live``)."""
    run, step = running
    other = start_run(agent=run.agent, user=people["requester"], input="another")
    layer = get_channel_layer()

    def undone_work():  # every kind of push a writer owes: a phase, a transition of a step and of the run
        set_phase(run, "calling_model")
        apply(step.succeed, actor="worker", response={}, input_tokens=1, output_tokens=1, cost_usd=0,
              now=timezone.now())
        apply(run.wait, actor="worker", waiting_reason="approval")
        raise RuntimeError("the writer gives up")

    def rollback_then_commits():
        with transaction.atomic() if rolled_back == "savepoint" else contextlib.nullcontext():
            with pytest.raises(RuntimeError):
                with transaction.atomic():
                    undone_work()
            apply(other.cancel, actor="user:requester")  # this thread's next commit (with the savepoint: the same)
        assert (run.status, run.last_event_seq) == ("waiting", 4), "the instance holds what was undone"
        apply(Run.objects.get(pk=run.pk).cancel, actor="user:requester")  # the run's next change, stored
        return Run.objects.values_list("status", "last_event_seq").get(pk=run.pk)

    @async_to_sync
    async def scenario():
        updates = await listening(layer, run_group(run.pk))
        stored = await database_sync_to_async(rollback_then_commits)()
        update = (await asyncio.wait_for(layer.receive(updates), 5))["run"]
        assert (update["status"], update["seq"]) == stored == ("cancelled", 3)

    scenario()


def test_json_values_are_copied_deeply_even_when_pickle_refuses_them():
    """``apply`` snapshots JSON values before a transition; what pickle cannot copy is deep-copied."""
    from runs.transitions import _copy

    def local():
        return 1

    plain = {"amount": "60.00", "lines": [{"sku": "a"}]}
    odd = {"hook": local, "lines": [{"sku": "a"}]}  # a local function: pickle refuses it
    for value in (plain, odd):
        copied = _copy(value)
        assert copied == value
        assert copied["lines"] is not value["lines"] and copied["lines"][0] is not value["lines"][0]
