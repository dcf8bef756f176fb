"""The engine runs many runs per process: calls are awaited, not held by a thread, and they end on time.

Every test here uses the real Dramatiq worker of ``tests/conftest.py``
with ONE worker thread: runs in flight together are the engine's doing
(``runs.engine.runtime``), never the broker's threads. Nothing here
asserts a duration: a hung call is hung for good (it waits on an event
the test sets only at its end), so a run that finishes at all did not
wait for it.
"""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import lease
from runs.base import awaiting
from runs.engine.lifecycle import cancel_run, start_run
from runs.models import DeathBlame, Run, RunStatus, Step
from tests.support.durability import lookup_agent, make_agent
from tests.support.provider import core_llm  # noqa: F401  (a fixture)
from tools import registry
from tools.models import ToolCall, ToolCallStatus
from tools.registry import Tool

S = ToolCallStatus
PARAMETERS = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
              "additionalProperties": False}


def use_tool(monkeypatch, name: str, handler, **fields) -> Tool:
    """Register a tool of this test only."""
    tool = Tool(name=name, description=name, parameters=PARAMETERS, handler=handler, **fields)
    monkeypatch.setitem(registry._TOOLS, name, tool)
    return tool


def calling(slug: str, tool: str, **agent_fields):
    """An agent that calls ``tool`` once, then answers."""
    agent = make_agent(slug, [{"tool_calls": [{"name": tool, "arguments": {"key": "k"}}]}, {"content": "Done."}],
                       tools=[tool])
    if agent_fields:
        type(agent).objects.filter(pk=agent.pk).update(**agent_fields)
        agent.refresh_from_db()
    return agent


def wait_until(predicate, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.fixture
def hung(transactional_db):
    """A ``threading.Event`` that hung handlers wait on; set when the test ends, so their threads go, before
    its tables are emptied (the database fixture waits for the runs they held to end: ``tests/conftest.py``)."""
    release = threading.Event()
    yield release
    release.set()


def test_runs_in_flight_wait_for_their_async_calls_together(people, worker, monkeypatch):
    """30 runs, one broker thread: every run's async handler is in flight at once (each waits for all)."""
    runs_count = 30
    state = {"in": 0, "most": 0, "all_in": None}

    async def gathering(ctx, args):
        state["all_in"] = state["all_in"] or asyncio.Event()
        state["in"] += 1
        state["most"] = max(state["most"], state["in"])
        if state["in"] == runs_count:
            state["all_in"].set()
        try:
            await asyncio.wait_for(state["all_in"].wait(), 20)
        except TimeoutError:
            pass  # not all came: the assertion below says how many did
        state["in"] -= 1
        return {"key": args["key"], "together": state["most"]}

    use_tool(monkeypatch, "gathering", gathering)
    agent = calling("together", "gathering")
    runs = [start_run(agent=agent, user=people["requester"], input=str(n)) for n in range(runs_count)]
    worker.drain(timeout_s=60)

    assert state["most"] == runs_count
    assert Run.objects.filter(pk__in=[r.pk for r in runs], status=RunStatus.COMPLETED).count() == runs_count
    assert {c.result["together"] for c in ToolCall.objects.filter(name="gathering")} == {runs_count}


def test_a_sync_handler_ignoring_its_timeout_ends_at_it_and_holds_back_no_other_run(people, worker, monkeypatch, hung):
    def stuck(ctx, args):
        hung.wait()  # ignores its timeout: only the test's end lets it go
        return {"late": True}

    use_tool(monkeypatch, "stuck_lookup", stuck, timeout_s=0.5, max_attempts=1)
    stuck_run = start_run(agent=calling("stuck", "stuck_lookup"), user=people["requester"], input="x")
    wait_until(lambda: ToolCall.objects.filter(run=stuck_run, status=S.RUNNING).exists())
    other = start_run(agent=lookup_agent(), user=people["requester"], input="y")
    worker.drain()

    stuck_run.refresh_from_db()
    other.refresh_from_db()
    assert other.status == RunStatus.COMPLETED and stuck_run.status == RunStatus.COMPLETED
    call = ToolCall.objects.get(run=stuck_run)
    assert call.status == S.FAILED and "No answer within 0.5 s" in call.error
    assert awaiting.abandoned_threads() >= 1  # still stuck: counted for operators
    hung.set()
    wait_until(lambda: awaiting.abandoned_threads() == 0)


def test_a_side_effect_past_its_timeout_is_unknown_and_reconciled(people, worker, monkeypatch, hung):
    async def stuck(ctx, args):
        await asyncio.sleep(3600)

    use_tool(monkeypatch, "stuck_send", stuck, side_effect=True, timeout_s=0.5)
    run = start_run(agent=calling("stuck-send", "stuck_send"), user=people["requester"], input="x")
    worker.drain()

    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert call.status == S.UNKNOWN and call.error.startswith("ToolTimeout")
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, "reconciliation")


@pytest.mark.parametrize("side_effect", [False, True])
def test_a_cancel_during_a_hung_call_takes_effect(people, worker, monkeypatch, hung, side_effect):
    def stuck(ctx, args):
        hung.wait()
        return {}

    use_tool(monkeypatch, "hung_call", stuck, side_effect=side_effect, timeout_s=3600)
    run = start_run(agent=calling("hung", "hung_call"), user=people["requester"], input="x")
    wait_until(lambda: ToolCall.objects.filter(run=run, status=S.RUNNING).exists())
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert run.status == RunStatus.CANCELLED
    assert "cancel was requested" in call.error
    assert call.status == (S.UNKNOWN if side_effect else S.FAILED)  # sent: it may have taken effect


def test_a_deadline_passing_during_a_call_fails_the_run(people, worker, monkeypatch, hung):
    async def stuck(ctx, args):
        await asyncio.sleep(3600)

    use_tool(monkeypatch, "slow_lookup", stuck, timeout_s=3600)
    run = start_run(agent=calling("late", "slow_lookup", deadline_s=1), user=people["requester"], input="x")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "deadline_exceeded")
    assert "deadline passed" in ToolCall.objects.get(run=run).error


def test_a_hung_model_call_holds_back_no_other_run_and_a_cancel_cuts_it_short(people, worker, core_llm):
    _server, agent = core_llm("openai", [{"content": "Too late.", "delay_s": 300}])
    hung_run = start_run(agent=agent, user=people["requester"], input="x")
    wait_until(lambda: Step.objects.filter(run=hung_run, status="started").exists())
    other = start_run(agent=lookup_agent(), user=people["requester"], input="y")
    wait_until(lambda: Run.objects.get(pk=other.pk).status == RunStatus.COMPLETED)

    assert Run.objects.get(pk=hung_run.pk).status == RunStatus.RUNNING  # still waiting for its model
    cancel_run(run=Run.objects.get(pk=hung_run.pk), actor="user:requester")
    worker.drain()
    hung_run.refresh_from_db()
    assert hung_run.status == RunStatus.CANCELLED
    step = Step.objects.get(run=hung_run)
    assert step.status == "discarded" and "cancel was requested" in step.error


def test_a_deadline_passing_during_a_model_call_fails_the_run(people, worker, core_llm):
    _server, agent = core_llm("openai", [{"content": "Too late.", "delay_s": 300}], agent_fields={"deadline_s": 1})
    run = start_run(agent=agent, user=people["requester"], input="x")
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "deadline_exceeded")
    assert "deadline passed" in Step.objects.get(run=run).error


def test_a_full_engine_refuses_a_hand_over_after_a_while_without_taking_the_lease(people, monkeypatch, hung):
    from runs.engine import runtime

    def stuck(ctx, args):
        hung.wait()
        return {}

    use_tool(monkeypatch, "busy_lookup", stuck, timeout_s=60)
    monkeypatch.setattr(runtime, "SUBMIT_WAIT_S", 0.2)
    engine = runtime.Engine(runs_in_flight=1, db_threads=1)
    agent = calling("busy", "busy_lookup")
    first, second = (start_run(agent=agent, user=people["requester"], input=str(n)) for n in range(2))
    assert engine.submit(first.pk) is not None
    wait_until(lambda: ToolCall.objects.filter(run=first, status=S.RUNNING).exists())

    with pytest.raises(runtime.EngineFull):
        engine.submit(second.pk)
    assert Run.objects.get(pk=second.pk).lease_owner == ""  # its lease was never taken
    hung.set()
    assert engine.wait_idle(30)
    assert engine.submit(second.pk) is not None  # room again
    assert engine.wait_idle(30)
    assert Run.objects.get(pk=second.pk).status == RunStatus.COMPLETED
    engine.close_connections()


def test_an_engine_is_not_at_rest_while_a_hand_over_is_under_way(people, monkeypatch):
    """``wait_idle`` waits for a ``submit`` that has not returned, whose run is not in flight yet (as a suspect
    waiting for the process to empty is not): its database work is still to come."""
    from runs.engine import runtime

    taking, go_on = threading.Event(), threading.Event()
    acquire = lease.acquire

    def slow_acquire(*args, **kwargs):
        taking.set()
        go_on.wait(30)
        return acquire(*args, **kwargs)

    monkeypatch.setattr(lease, "acquire", slow_acquire)
    use_tool(monkeypatch, "quick_lookup", lambda ctx, args: {})
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    run = start_run(agent=calling("quick", "quick_lookup"), user=people["requester"], input="x")
    handing_over = threading.Thread(target=engine.submit, args=(run.pk,))
    handing_over.start()
    try:
        assert taking.wait(10)
        assert engine.in_flight == 0 and not engine.wait_idle(0.2)
    finally:
        go_on.set()
    assert engine.wait_idle(30)
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED  # nothing of it was left to do
    handing_over.join(10)
    engine.close_connections()


def test_a_suspect_run_waits_for_the_process_to_empty_and_is_advanced_alone(people, monkeypatch, hung):
    """A run whose worker died on it before (crash streak 1) does not start beside a run in flight, and no
    run starts beside it: if its step kills the process again, it dies alone and is blamed alone."""
    from runs.engine import runtime

    seen = {}

    def stuck(ctx, args):
        hung.wait()
        return {}

    def counting(ctx, args):
        seen[ctx.run.pk] = engine.in_flight
        return {}

    use_tool(monkeypatch, "busy_lookup", stuck, timeout_s=60)
    use_tool(monkeypatch, "quick_lookup", counting)
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    busy = start_run(agent=calling("busy", "busy_lookup"), user=people["requester"], input="busy")
    quick = calling("quick", "quick_lookup")
    suspect, later = (start_run(agent=quick, user=people["requester"], input=name) for name in ("suspect", "later"))
    Run.objects.filter(pk=suspect.pk).update(crash_streak=1, loss_streak=1, suspect=True)
    assert engine.submit(busy.pk) is not None
    wait_until(lambda: ToolCall.objects.filter(run=busy, status=S.RUNNING).exists())

    threading.Thread(target=engine.submit, args=(suspect.pk,), daemon=True).start()
    wait_until(lambda: suspect.pk in engine.quarantine)
    threading.Thread(target=engine.submit, args=(later.pk,), daemon=True).start()
    time.sleep(0.5)  # both would have started by now; each keeps its lease while it waits
    assert Run.objects.get(pk=suspect.pk).lease_owner == lease.WORKER_ID
    assert Run.objects.get(pk=later.pk).lease_owner == lease.WORKER_ID
    assert not Step.objects.filter(run__in=[suspect, later]).exists()

    hung.set()
    wait_until(lambda: Run.objects.filter(pk__in=[busy.pk, suspect.pk, later.pk],
                                          status=RunStatus.COMPLETED).count() == 3)
    assert seen[suspect.pk] == 1  # alone in the process while its tool ran
    assert engine.isolated == 1 and not engine.quarantine
    assert engine.wait_idle(30)
    engine.close_connections()


def test_with_a_quarantine_queue_a_suspect_is_sent_there_and_only_its_workers_advance_it(people, monkeypatch,
                                                                                         settings):
    """``QUARANTINE_QUEUE`` set: a regular worker gives a suspect's lease back and sends the run to that queue,
    and takes the next run at once instead of emptying; a worker of the quarantine queue advances it."""
    from runs.engine import runtime

    settings.TOLLGATE = {**settings.TOLLGATE, "QUARANTINE_QUEUE": "quarantine"}
    sent = []
    monkeypatch.setattr(runtime, "wake_now", lambda run_id, **options: sent.append((run_id, options)))
    use_tool(monkeypatch, "quick_lookup", lambda ctx, args: {})
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    agent = calling("quick", "quick_lookup")
    suspect, plain = (start_run(agent=agent, user=people["requester"], input=name) for name in ("suspect", "plain"))
    Run.objects.filter(pk=suspect.pk).update(crash_streak=1, loss_streak=1, suspect=True)

    assert engine.submit(suspect.pk) is None
    assert sent == [(suspect.pk, {"suspect": True})]
    assert Run.objects.get(pk=suspect.pk).lease_owner == ""  # given back, for the quarantine's worker to take
    assert engine.submit(plain.pk) is not None  # no emptying of this process for the suspect
    wait_until(lambda: Run.objects.get(pk=plain.pk).status == RunStatus.COMPLETED)
    assert (engine.forwarded, engine.isolated) == (1, 0)

    assert engine.submit(suspect.pk, quarantine_worker=True) is not None  # from the quarantine queue
    wait_until(lambda: Run.objects.get(pk=suspect.pk).status == RunStatus.COMPLETED)
    assert (engine.forwarded, engine.isolated) == (1, 1)
    assert engine.wait_idle(30)
    engine.close_connections()


def test_with_a_quarantine_queue_a_run_taken_from_a_holder_that_died_is_still_a_suspect_there(people, monkeypatch,
                                                                                             settings):
    """A run whose holder died on it (its lease ran out, never given back, no sweep yet) is a suspect only by the
    lease it replaced (``lease.acquire``). Sent on to the quarantine queue, it must still be one there: giving the
    lease back must not wipe out that evidence, or the quarantine's worker advances it as no suspect, beside
    other runs (what ``test_a_suspect_waiting_for_its_process_to_empty_keeps_its_lease`` guards against)."""
    from runs.engine import runtime

    settings.TOLLGATE = {**settings.TOLLGATE, "QUARANTINE_QUEUE": "quarantine"}
    sent = []
    monkeypatch.setattr(runtime, "wake_now", lambda run_id, **options: sent.append((run_id, options)))
    use_tool(monkeypatch, "quick_lookup", lambda ctx, args: {})
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    suspect = start_run(agent=calling("quick", "quick_lookup"), user=people["requester"], input="suspect")
    lease.acquire(suspect.pk, owner="dead")  # its holder died; its lease ran out, never given back
    Run.objects.filter(pk=suspect.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    assert engine.submit(suspect.pk) is None  # a regular worker: sent on
    assert sent == [(suspect.pk, {"suspect": True})]
    held = engine.submit(suspect.pk, quarantine_worker=True)  # the quarantine queue's worker
    assert held is not None and held.suspect
    wait_until(lambda: Run.objects.get(pk=suspect.pk).status == RunStatus.COMPLETED)
    assert engine.isolated == 1
    assert engine.wait_idle(30)
    engine.close_connections()


def test_the_embedded_run_worker_consumes_the_quarantine_queue(settings):
    """``serve``'s embedded shape has one run worker: with ``QUARANTINE_QUEUE`` set, the suspects a worker sends
    on to that queue must be consumed by it, or they are never advanced (and the sweeper, finding their
    wake-up waiting there, never sends them again)."""
    from dramatiq.brokers.stub import StubBroker

    from runs.management.commands.serve import embedded_workers

    settings.TOLLGATE = {**settings.TOLLGATE, "QUARANTINE_QUEUE": "quarantine"}
    run_worker, _ = embedded_workers(StubBroker())
    assert "quarantine" in run_worker.consumer_whitelist  # the queues it consumes (Dramatiq's name)


def test_a_suspect_waiting_in_the_quarantine_queue_is_not_sent_again_by_the_sweeper(people, settings):
    """``wake_now(suspect=True)`` puts ``advance_suspect`` on the quarantine queue, and the sweeper's look at what
    waits in the broker sees it there (a broker of the test's own: no worker of another test takes it)."""
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from runs.wakeups import QUARANTINE_ACTOR, runs_with_pending_wakeups, wake_now

    settings.TOLLGATE = {**settings.TOLLGATE, "QUARANTINE_QUEUE": "quarantine-test"}
    run = start_run(agent=lookup_agent(), user=people["requester"], input="x")
    shared, broker = dramatiq.get_broker(), StubBroker()
    dramatiq.set_broker(broker)
    try:
        wake_now(run.pk, suspect=True)
        assert runs_with_pending_wakeups() == {run.pk}
        message, = (dramatiq.Message.decode(data) for data in broker.queues["quarantine-test"].queue)
        assert (message.actor_name, list(message.args)) == (QUARANTINE_ACTOR, [run.pk])
    finally:
        dramatiq.set_broker(shared)


def test_suspects_not_blamed_share_one_quarantine_and_a_blamed_one_waits_to_have_it_alone(people, monkeypatch, hung):
    """Suspects with no death laid on them (the flight recorder found each running beside another) are advanced
    together, with no other run in flight; one a death was blamed on waits until they are done and then has
    the process to itself; a run that is no suspect waits for both."""
    from runs.engine import runtime

    seen = {}

    def held_open(ctx, args):
        seen[ctx.run.pk] = (engine.in_flight, engine.quarantine)
        hung.wait()
        return {}

    use_tool(monkeypatch, "gated_lookup", held_open, timeout_s=60)
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    agent = calling("gated", "gated_lookup")
    first, second, blamed, plain = (start_run(agent=agent, user=people["requester"], input=name)
                                    for name in ("first", "second", "blamed", "plain"))
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(loss_streak=1, suspect=True)
    Run.objects.filter(pk=blamed.pk).update(crash_streak=1, loss_streak=1, suspect=True)
    for run in (first, second):
        threading.Thread(target=engine.submit, args=(run.pk,), daemon=True).start()
    wait_until(lambda: len(seen) == 2)
    # In flight together, in one quarantine: counted once both calls hang (the first one's handler may run
    # before the second suspect has joined, so what each saw as it began may be 1).
    assert engine.in_flight == 2 and engine.quarantine == {first.pk, second.pk}
    threading.Thread(target=engine.submit, args=(blamed.pk,), daemon=True).start()
    threading.Thread(target=engine.submit, args=(plain.pk,), daemon=True).start()
    time.sleep(0.5)  # either would have started by now
    assert set(seen) == {first.pk, second.pk}

    hung.set()
    wait_until(lambda: Run.objects.filter(status=RunStatus.COMPLETED).count() == 4)
    assert seen[blamed.pk] == (1, {blamed.pk})  # alone
    assert seen[plain.pk][0] == 1  # not beside a suspect (before the blamed one took the process, or after)
    assert engine.isolated == 3
    assert not Run.objects.filter(suspect=True).exists()  # each got through its call: no longer a suspect
    assert engine.wait_idle(30)
    engine.close_connections()


def test_a_suspect_waiting_for_its_process_to_empty_keeps_its_lease(people, monkeypatch, hung, settings):
    """A run taken from a holder that died on it (no sweep yet) is a suspect; while it waits to be advanced
    alone its lease stays held and fresh, so the sweeper does not send it to another worker meanwhile, where
    it would start beside other runs as no suspect."""
    from runs.engine import runtime
    from runs.engine.sweep_jobs import rescue_stranded

    def stuck(ctx, args):
        hung.wait()
        return {}

    use_tool(monkeypatch, "busy_lookup", stuck, timeout_s=60)
    use_tool(monkeypatch, "quick_lookup", lambda ctx, args: {})
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    busy = start_run(agent=calling("busy", "busy_lookup"), user=people["requester"], input="busy")
    suspect = start_run(agent=calling("quick", "quick_lookup"), user=people["requester"], input="suspect")
    lease.acquire(suspect.pk, owner="dead")  # its holder died; its lease ran out, never given back
    Run.objects.filter(pk=suspect.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert engine.submit(busy.pk) is not None
    wait_until(lambda: ToolCall.objects.filter(run=busy, status=S.RUNNING).exists())

    threading.Thread(target=engine.submit, args=(suspect.pk,), daemon=True).start()
    wait_until(lambda: suspect.pk in engine.quarantine)
    waiting = Run.objects.get(pk=suspect.pk)
    assert waiting.lease_owner == lease.WORKER_ID and waiting.lease_expires_at > timezone.now()
    later = timezone.now() + timedelta(seconds=settings.TOLLGATE["QUEUED_GRACE_S"] + 1)
    Run.objects.filter(pk__in=[busy.pk, suspect.pk]).update(  # as the keeper renews held leases
        lease_expires_at=later + timedelta(seconds=60))
    assert rescue_stranded(now=later) == {"reenqueued": 0}
    assert lease.acquire(suspect.pk, owner="another-worker") is None

    hung.set()
    wait_until(lambda: Run.objects.filter(pk__in=[busy.pk, suspect.pk], status=RunStatus.COMPLETED).count() == 2)
    assert engine.isolated == 1
    assert engine.wait_idle(30)
    engine.close_connections()


def test_a_suspect_whose_process_stays_busy_is_handed_back_still_a_suspect(people, monkeypatch, hung):
    """Past ``SUBMIT_WAIT_S`` a suspect is handed back (``EngineFull``) with its lease given back as it was found
    (its dead holder's, run out), so the next worker to take it finds the same run: a suspect (only by the
    abandoned lease it replaced) and blamed (advanced alone, not beside other suspects); and no lease runs out
    under this live worker to be counted as a death."""
    from runs.engine import runtime

    def stuck(ctx, args):
        hung.wait()
        return {}

    use_tool(monkeypatch, "busy_lookup", stuck, timeout_s=60)
    monkeypatch.setattr(runtime, "SUBMIT_WAIT_S", 0.3)
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    busy = start_run(agent=calling("busy", "busy_lookup"), user=people["requester"], input="busy")
    suspect = start_run(agent=calling("quick", "busy_lookup"), user=people["requester"], input="suspect")
    lease.acquire(suspect.pk, owner="dead")  # its holder died; its lease ran out, never given back
    Run.objects.filter(pk=suspect.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert engine.submit(busy.pk) is not None
    wait_until(lambda: ToolCall.objects.filter(run=busy, status=S.RUNNING).exists())

    with pytest.raises(runtime.EngineFull):
        engine.submit(suspect.pk)
    assert not engine.quarantine and not Step.objects.filter(run=suspect).exists()
    assert Run.objects.get(pk=suspect.pk).lease_owner == "dead"
    taken = lease.acquire(suspect.pk, owner="another-worker")
    assert taken.suspect and taken.blamed
    hung.set()
    assert engine.wait_idle(30)
    engine.close_connections()


def test_two_slices_of_one_run_in_one_process_each_keep_their_own_cancel_signal(people, monkeypatch, hung):
    """The sweeper broke the lease of a slice still in flight here (its keeper stalled past the TTL), and the
    run's next slice starts in the same process beside the old one: the old one ending takes nothing of the
    new one's, which goes on to the end."""
    from runs.engine import runtime

    go_on = threading.Event()
    attempts = []

    def lookup(ctx, args):
        attempts.append(ctx.run.pk)
        (hung if len(attempts) == 1 else go_on).wait()
        return {"found": True}

    use_tool(monkeypatch, "slow_lookup", lookup, timeout_s=60)
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    run = start_run(agent=calling("slow", "slow_lookup"), user=people["requester"], input="x")
    assert engine.submit(run.pk) is not None
    wait_until(lambda: len(attempts) == 1)
    # What the sweeper writes when it breaks the lease of a bystander of a dead worker.
    Run.objects.filter(pk=run.pk).update(lease_owner="", lease_expires_at=None, death_blame=DeathBlame.BYSTANDER,
                                         loss_streak=1)
    assert engine.submit(run.pk) is not None
    wait_until(lambda: len(attempts) == 2)  # the new slice sent the lookup again
    hung.set()
    wait_until(lambda: engine.in_flight == 1)  # the old slice ended (its writes refused)
    go_on.set()
    assert engine.wait_idle(30)
    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    engine.close_connections()


@pytest.mark.parametrize("error, sends, status", [("not sent", 2, S.SUCCEEDED), ("unavailable", 1, S.UNKNOWN)])
def test_a_side_effect_that_was_certainly_not_sent_is_sent_again_after_a_backoff(error, sends, status, people, worker,
                                                                                 monkeypatch):
    """No connection could be made (``ToolNotSent``): nothing left, so the side effect is simply sent again;
    a failure after which it may have left (``ToolUnavailable``) makes it unknown, never sent again blindly."""
    from tools.registry import ToolNotSent, ToolUnavailable

    sent = []

    async def flaky(ctx, args):
        sent.append(ctx.idempotency_key)
        if len(sent) == 1:
            raise (ToolNotSent if error == "not sent" else ToolUnavailable)("connection refused")
        return {"booked": args["key"]}

    use_tool(monkeypatch, "flaky_send", flaky, side_effect=True, backoff_s=0.01)
    run = start_run(agent=calling("flaky-send", "flaky_send"), user=people["requester"], input="x")
    worker.drain()

    call = ToolCall.objects.get(run=run)
    assert (len(sent), call.status, call.attempts) == (sends, status, sends)
    assert len(set(sent)) == 1  # one idempotency key for every send


def test_a_database_error_in_the_slices_first_work_gives_the_lease_back_and_retries_soon(people, monkeypatch):
    """The first work runs in the broker's thread (``Engine.submit``); a backend that dies under it (a restart,
    a failover) must not leave the lease held, which would make the run's next taker find a worker's death."""
    from django.db import connection

    from runs.engine import runtime

    if connection.vendor != "postgresql":
        pytest.skip("ends its own PostgreSQL backend")
    run = start_run(agent=make_agent("db-blip-first", [{"content": "Done."}], tools=[]), user=people["requester"],
                    input="x")
    woken = []

    def dying_slice(run_id, run=None):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        yield  # never reached

    monkeypatch.setattr(runtime, "advance_slice", dying_slice)
    monkeypatch.setattr(runtime, "wake_on_commit", lambda run_id, **options: woken.append((run_id, options)))
    engine = runtime.Engine(runs_in_flight=2, db_threads=1)
    taken = {}

    def broker():  # a thread of its own, as a Dramatiq worker thread is
        try:
            taken["lease"] = engine.submit(run.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=broker)
    thread.start()
    thread.join(30)
    assert taken["lease"] is not None and engine.wait_idle(10) and engine.in_flight == 0
    engine.close_connections()
    assert Run.objects.values_list("lease_owner", "lease_expires_at").get(pk=run.pk) == ("", None)
    assert woken == [(run.pk, {"delay_ms": runtime.RETRY_AFTER_DB_ERROR_MS})]


def test_worker_processes_of_the_two_queues_forward_a_suspect_and_advance_it_in_quarantine(people, settings):
    """The production shape of ``QUARANTINE_QUEUE``: ``rundramatiq --queues default`` processes send a suspect on
    (``advance_run``), and only a ``rundramatiq --queues <it>`` process advances it (``advance_suspect``, declared
    in a worker process that has the setting), in quarantine."""
    import dramatiq

    from runs.wakeups import runs_with_pending_wakeups
    from tests.support.processes import worker_environment

    if not settings.REDIS_URL:
        pytest.skip("worker processes need the Redis broker")
    queue = "quarantine-e2e"
    settings.TOLLGATE = {**settings.TOLLGATE, "QUARANTINE_QUEUE": queue}
    broker = dramatiq.get_broker()
    broker.flush_all()
    broker.flush(queue)  # not declared in this process: flush_all leaves a message of an earlier try there
    run = start_run(agent=make_agent("e2e", [{"content": "Done."}], tools=[]), user=people["requester"], input="x")
    Run.objects.filter(pk=run.pk).update(crash_streak=1, loss_streak=1, suspect=True)
    environment = worker_environment(TOLLGATE_QUARANTINE_QUEUE=queue, LOG_LEVEL="INFO")

    def worker(queue_name: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "manage.py", "rundramatiq", "--processes", "1", "--threads", "1",
                                 "--skip-logging", "--queues", queue_name], cwd=settings.BASE_DIR, env=environment,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)

    workers = [worker("default")]  # start_run sent the run's wake-up to the default queue
    try:
        wait_until(lambda: _queued(broker, queue) == 1, timeout_s=60)  # sent on, not advanced
        assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
        assert run.pk in runs_with_pending_wakeups()
        workers.append(worker(queue))
        wait_until(lambda: Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED, timeout_s=60)
    finally:
        for process in workers:
            process.terminate()
        logs = [_output(process) for process in workers]
        broker.flush(queue)
    assert f"run {run.pk}: its worker died on it before; it is advanced in quarantine alone" in logs[1]
    assert "advanced in quarantine" not in logs[0]
    assert Run.objects.get(pk=run.pk).lease_owner == ""


def _queued(broker, queue_name: str) -> int:
    """Messages waiting in ``queue_name`` of the Redis broker (Dramatiq keeps a queue's message ids in a list)."""
    return broker.client.llen(f"{broker.namespace}:{queue_name}")


def _output(process) -> str:
    """What a worker process told stderr once it exits (terminated: at most 60 s); killed with its worker
    processes (its session) if it does not, so none is left consuming the tests' broker for the rest of the run."""
    try:
        return process.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()[1]
