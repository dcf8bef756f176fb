"""What the loop keeps between passes never hides another writer's change (runs/engine/state.py).

Each test lets a person act in the middle of a worker's slice, at the point
where the worker's own copy of the run would go stale: input supplemented
while a tool runs, and an approval given between the proposal and the wait.
"""

import asyncio
import contextlib
import dataclasses
import weakref

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.base.awaiting import resume
from runs.engine import loop
from runs import services, transitions
from runs.engine.lifecycle import cancel_run, start_run, submit_input
from runs.engine.context import build_context
from runs.models import Agent, Message, MultitaskStrategy, Run, RunEvent, RunStatus
from runs.services import append_event
from tests.support.core import CORE_TOOLS, lookup, transfer
from tests.support.fake_tools import transfers
from tools import registry
from tools.models import ToolCall

LOOKUP = {"tool_calls": [lookup("acme")]}
TRANSFER = {"tool_calls": [transfer("acme", 80)]}


@pytest.fixture
def requests_seen(monkeypatch):
    """Every ``ModelRequest`` the loop sends, in order."""
    seen = []
    get_client = loop.get_client

    def client(config):
        real = get_client(config)

        async def complete(request):
            seen.append(request)
            return await real.complete(request)

        return type("Recording", (), {"complete": staticmethod(complete), "timeout_s": real.timeout_s})()

    monkeypatch.setattr(loop, "get_client", client)
    return seen


def _hurry(agent: Agent, user, session) -> None:
    """A person adds "and please hurry" to the session's busy run (``MultitaskStrategy.SUPPLEMENT``)."""
    submit_input(agent=agent, user=user, input="and please hurry", session=session,
                 multitask_strategy=MultitaskStrategy.SUPPLEMENT)


def _agent(turns, check: str = "fake_transfer") -> Agent:
    return Agent.objects.create(slug="knowing", name="knowing", tools=CORE_TOOLS,
                                completion_check=check, model={"provider": "scripted", "turns": turns})


def test_input_supplemented_while_a_tool_runs_reaches_the_next_model_call(
        idle_worker, people, monkeypatch, requests_seen):
    agent = _agent([LOOKUP, {"content": "Done."}], check="default")
    run = start_run(agent=agent, user=people["requester"], input="look acme up")
    tool = registry.get_tool("fake_lookup")

    session = run.session  # read here: the handler runs in the handler pool

    def handler(context, arguments):  # a person adds to the conversation while the call is out
        _hurry(agent, people["requester"], session)
        return tool.handler(context, arguments)

    monkeypatch.setitem(registry._TOOLS, "fake_lookup", dataclasses.replace(tool, handler=handler))
    loop.advance(run.pk)

    second = requests_seen[1]
    assert [m["content"] for m in second.messages if m["role"] == "user"] == ["look acme up", "and please hurry"]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert not run.events.filter(type="input", reason__contains="not read").exists()


def test_input_supplemented_right_after_the_workers_own_write_reaches_the_next_model_call(
        idle_worker, people, monkeypatch, requests_seen):
    """Inside a group commit, a pass that follows the worker's own write with no call in between does not read
    the event counter (``runs.services.counter_confirmed``), unless another instance appended to the run since;
    alone, it does: here input is supplemented in this very process and stretch of code, right after the tool
    call's outcome is stored and before the pass that asks the model again."""
    agent = _agent([LOOKUP, {"content": "Done."}], check="default")
    run = start_run(agent=agent, user=people["requester"], input="look acme up")
    execute = loop._execute

    def then_supplemented(run, known, call):
        going_on = yield from execute(run, known, call)
        _hurry(agent, people["requester"], run.session)
        return going_on

    monkeypatch.setattr(loop, "_execute", then_supplemented)
    loop.advance(run.pk)

    second = requests_seen[1]
    assert [m["content"] for m in second.messages if m["role"] == "user"] == ["look acme up", "and please hurry"]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


@contextlib.contextmanager
def _another_process(monkeypatch):
    """Writes in the block are made as by another process: this one's record of who last appended to each run
    (``runs.services._last_writer``, process-local) does not see them."""
    with monkeypatch.context() as patched:
        patched.setattr(services, "_last_writer", weakref.WeakValueDictionary())
        yield


def test_a_cancel_another_process_commits_right_after_the_workers_own_write_is_seen_at_the_next_pass(
        idle_worker, people, monkeypatch, requests_seen):
    """The tool call's outcome is committed; before the next pass a person cancels the run through another
    process (the API): that pass, a safe point, ends the run rather than asking the model again. Between
    the two, the worker's stretch of code may run commit hooks that wait (a target's waiters woken, the
    broker told), so the counter its reservation read is older than the pass."""
    agent = _agent([LOOKUP, {"content": "Done."}], check="default")
    run = start_run(agent=agent, user=people["requester"], input="look acme up")
    execute = loop._execute

    def then_cancelled(run, known, call):
        going_on = yield from execute(run, known, call)
        with _another_process(monkeypatch):
            cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
        return going_on

    monkeypatch.setattr(loop, "_execute", then_cancelled)
    loop.advance(run.pk)

    assert len(requests_seen) == 1
    run.refresh_from_db()
    assert (run.status, run.events.filter(reason="cancelled at a safe point").count()) == (RunStatus.CANCELLED, 1)


def test_a_decision_another_process_made_before_the_wait_is_read_at_the_next_pass(idle_worker, people, monkeypatch):
    """The worker's own lock of the row (``relock``, before it would wait) finds an approver's decision,
    made through another process, that came after the worker's last write: the next pass reads the row again."""
    run = start_run(agent=_agent([TRANSFER, {"content": "Sent."}]), user=people["requester"], input="send 80")
    wait_for_approval = loop._wait_for_approval

    def approved_first(run):
        with _another_process(monkeypatch):
            decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")
        return wait_for_approval(run)

    monkeypatch.setattr(loop, "_wait_for_approval", approved_first)
    _compare_at_every_pass(monkeypatch)
    loop.advance(run.pk)

    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert len(transfers()) == 1


def test_an_approval_given_before_the_run_waits_is_acted_on_in_the_same_slice(idle_worker, people, monkeypatch):
    run = start_run(agent=_agent([TRANSFER, {"content": "Sent."}]), user=people["requester"], input="send 80")
    wait_for_approval = loop._wait_for_approval

    def approved_first(run):  # the approver is quicker than the worker's next pass
        decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")
        return wait_for_approval(run)

    monkeypatch.setattr(loop, "_wait_for_approval", approved_first)
    loop.advance(run.pk)

    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert not run.events.filter(to_status=RunStatus.WAITING).exists()
    assert len(transfers()) == 1


def test_an_event_counter_in_memory_moves_only_over_its_own_unbroken_series(run_with_history):
    mine, theirs = Run.objects.get(pk=run_with_history.pk), Run.objects.get(pk=run_with_history.pk)
    start = mine.last_event_seq
    with transaction.atomic():
        append_event(mine, type="note", actor="worker")
    with transaction.atomic():
        append_event(theirs, type="note", actor="user:approver")  # another writer slips in
        append_event(mine, type="note", actor="worker")
    assert mine.last_event_seq == start + 1, "the gap shows: the database is at start + 3"
    assert Run.objects.get(pk=mine.pk).last_event_seq == start + 3
    assert list(RunEvent.objects.filter(run=mine, seq__gt=start).values_list("seq", flat=True)) == [
        start + 1, start + 2, start + 3]


def test_the_counter_is_taken_as_read_only_while_its_reservations_transaction_holds_the_row(run_with_history):
    """``counter_confirmed``: inside one transaction (a group commit's) after the instance's own events, not
    once their savepoint rolled back (the instance's counter is ahead then), nor once they committed."""
    from django.db import DataError

    run, seen = Run.objects.get(pk=run_with_history.pk), []

    def stretch():
        with transaction.atomic():  # a group commit's transaction
            with transaction.atomic():
                append_event(run, type="note", actor="worker")
            seen.append(services.counter_confirmed(run))
            with contextlib.suppress(DataError), transaction.atomic():
                append_event(run, type="note", actor="worker")
                raise DataError("refused after the reservation")
            seen.append(services.counter_confirmed(run))
        with transaction.atomic():
            append_event(run, type="note", actor="worker")
        seen.append(services.counter_confirmed(run))
        yield from ()

    assert resume(stretch(), None) == (True, None)
    assert seen == [True, False, False]


@pytest.fixture
def run_with_history(people):
    return start_run(agent=_agent([{"content": "Done."}], check="default"), user=people["requester"], input="hello")


def test_input_supplemented_during_the_final_model_call_is_handed_on_not_lost(idle_worker, people, monkeypatch):
    """The ending takes what the loop knows only while the run's counter shows no other writer: input
    that arrives while the model writes its final answer is never read by it, so it starts the next run."""
    agent = _agent([{"content": "Done."}], check="default")
    run = start_run(agent=agent, user=people["requester"], input="look acme up")
    get_client = loop.get_client

    def client(config):
        real = get_client(config)

        async def complete(request):
            await asyncio.to_thread(  # the database is not touched from the event loop
                submit_input, agent=agent, user=people["requester"], input="and globex too", session=run.session,
                multitask_strategy=MultitaskStrategy.SUPPLEMENT)
            return await real.complete(request)

        return type("Interrupted", (), {"complete": staticmethod(complete), "timeout_s": real.timeout_s})()

    monkeypatch.setattr(loop, "get_client", client)
    loop.advance(run.pk)

    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    event = run.events.get(type="input", reason__startswith="supplemented input was not read")
    following = Run.objects.get(pk=event.payload["run"])
    assert following.input == "and globex too" and following.status == RunStatus.QUEUED


def _compare_at_every_pass(monkeypatch) -> list[int]:
    """Make every pass first assert that the loop's run instance holds what the row holds (the lease's
    columns aside); returns the list of ``model_calls`` seen at each pass."""
    lease_columns = {"lease_owner", "lease_token", "lease_expires_at"}
    fields = [f.attname for f in Run._meta.concrete_fields if not f.is_relation and f.attname not in lease_columns]
    compared = []
    step = loop._step

    def checked(run, known):
        stored = Run.objects.values(*fields).get(pk=run.pk)
        assert {name: getattr(run, name) for name in fields} == stored
        compared.append(run.model_calls)
        return step(run, known)

    monkeypatch.setattr(loop, "_step", checked)
    return compared


def test_the_loops_run_instance_is_what_the_row_holds_at_every_pass(idle_worker, people, monkeypatch):
    """``Known.revalidate`` reads only the event counter, so every write of the loop's own to the run row
    must show in its instance: counters after a model call, a repair turn, a tool call, an approval."""
    agent = _agent([LOOKUP, {"content": ""}, TRANSFER, {"content": "Sent."}])
    run = start_run(agent=agent, user=people["requester"], input="send 80 to acme")
    compared = _compare_at_every_pass(monkeypatch)
    loop.advance(run.pk)
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")
    loop.advance(run.pk)

    run.refresh_from_db()
    assert (run.status, run.outcome, run.repair_turns) == (RunStatus.COMPLETED, "achieved", 1)
    assert compared[-1] == 3 and len(compared) >= 7  # the passes after each model call were compared


def test_a_model_answer_the_database_refuses_leaves_no_unstored_value_in_the_instance(
        idle_worker, people, monkeypatch):
    """The answer's transaction rolls back after the instance took its counters in; the loop carries on
    (a repair turn) and must not decide by what was never stored."""
    from django.db import DataError

    agent = _agent([{"content": "Done."}, {"content": "Done."}], check="default")
    run = start_run(agent=agent, user=people["requester"], input="look")
    compared = _compare_at_every_pass(monkeypatch)
    append_events = services.append_events
    refused = []

    def refusing(run, events, **kwargs):  # the answer's message goes with its step's events
        stored = append_events(run, events, **kwargs)
        answers = [row for row in kwargs.get("inserts", ()) if row.role == "assistant"]
        if answers and not refused:  # refused once the instance took the reservation's counters in
            refused.append(answers[0].content)
            raise DataError("value too long for type character varying")
        return stored

    monkeypatch.setattr(transitions, "append_events", refusing)
    loop.advance(run.pk)

    run.refresh_from_db()
    assert refused == ["Done."] and run.status == RunStatus.COMPLETED
    assert run.repair_turns == 1 and run.model_calls == 1  # the refused answer's call was never counted
    assert compared == [0, 0]


def test_a_run_alone_in_its_session_starts_from_its_input_without_reading_the_history(
        idle_worker, people, requests_seen):
    """Begun in a session with no other run, the history is the input just stored: nothing is read back, and
    every model call sees what a read of the stored history gives."""
    agent = _agent([LOOKUP, {"content": "Done."}], check="default")
    run = start_run(agent=agent, user=people["requester"], input="look acme up")
    with CaptureQueriesContext(connection) as queries:
        loop.advance(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert not [query["sql"] for query in queries if 'FROM "runs_message"' in query["sql"]]
    assert not [query["sql"] for query in queries  # nor the session's call ids
                if 'FROM "tools_toolcall"' in query["sql"] and '"session_id"' in query["sql"]]
    stored = list(Message.objects.filter(session=run.session).order_by("id"))
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert requests_seen[0].messages == build_context(run, stored[:1]).messages
    assert requests_seen[1].messages == build_context(run, stored[:3]).messages


def test_a_later_run_of_a_session_reads_the_history_and_call_ids_of_the_runs_before_it(
        idle_worker, people, requests_seen):
    same_id = {"tool_calls": [{**lookup("acme"), "id": "call_same"}]}
    agent = _agent([same_id, {"content": "Done."}, same_id, {"content": "Done again."}], check="default")
    first = start_run(agent=agent, user=people["requester"], input="look acme up")
    loop.advance(first.pk)
    second = start_run(agent=agent, user=people["requester"], input="and once more", session=first.session)
    loop.advance(second.pk)
    second.refresh_from_db()
    assert second.status == RunStatus.COMPLETED
    assert [m["content"] for m in requests_seen[2].messages if m["role"] == "user"] == ["look acme up",
                                                                                        "and once more"]
    first_id, second_id = (ToolCall.objects.get(run=run).provider_call_id for run in (first, second))
    assert first_id == "call_same" != second_id  # the same id answered twice: the session's ids were known


def test_input_supplemented_right_after_a_lone_run_began_reaches_its_first_model_call(
        idle_worker, people, monkeypatch, requests_seen):
    """A run alone in its session starts from its input as the whole history (``Known.started``), and the
    slice's first pass reads no event counter (``Known.revalidate``: the row was just read). Input supplemented
    once the start has committed, before the first model call, is another writer's event: that call must
    see it, as it does when the history is read at the first pass."""
    agent = _agent([{"content": "Done."}], check="default")
    run = start_run(agent=agent, user=people["requester"], input="look acme up")
    begin = loop.begin_run

    def then_supplemented(run, *, actor):
        begun = begin(run, actor=actor)  # committed: the run is running, so a supplement joins it
        _hurry(agent, people["requester"], run.session)
        return begun

    monkeypatch.setattr(loop, "begin_run", then_supplemented)
    loop.advance(run.pk)

    first = requests_seen[0]
    assert [m["content"] for m in first.messages if m["role"] == "user"] == ["look acme up", "and please hurry"]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert not Run.objects.filter(session=run.session).exclude(pk=run.pk).exists()  # not handed on as a new run
