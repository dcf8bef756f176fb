"""Attacks on the engine that runs many runs per process (runs.base.awaiting, runs.engine.runtime).

Each test is a finding: what an adversary (a slow or misbehaving external
system, a person cancelling at the wrong moment) does, and what the run
must end as. Like tests/engine/test_engine_runtime.py, every test uses the real
Dramatiq worker with one broker thread; hung calls wait on an event the
test sets only at its end.
"""

import asyncio
import threading
from collections import Counter

import pytest

from runs.engine.lifecycle import cancel_run, start_run
from runs.models import Run, RunStatus, Step
from runs.providers import ModelError
from tests.engine.test_engine_runtime import calling, use_tool, wait_until
from tools.models import ToolCall, ToolCallStatus

S = ToolCallStatus


@pytest.fixture
def hung(transactional_db):
    """An event the test's hung calls wait for; set at teardown, before the database fixture waits for the
    engines to rest (``tests/conftest.py``)."""
    release = threading.Event()
    yield release
    release.set()


def test_a_cancel_during_a_hung_precondition_cancels_the_run(people, worker, monkeypatch, hung):
    """The precondition (a sync hook, asked at proposal) hangs; the requester cancels: the run ends
    ``cancelled``, not ``failed/internal_error`` (the hook's ``Interrupted`` is the cancel, not a bug)."""
    asked = threading.Event()

    def slow_precondition(ctx, args):
        asked.set()
        hung.wait()
        return None

    use_tool(monkeypatch, "guarded_send", lambda ctx, args: {}, side_effect=True, timeout_s=3600,
             precondition=slow_precondition)
    run = start_run(agent=calling("guarded", "guarded_send"), user=people["requester"], input="x")
    wait_until(asked.is_set)
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.CANCELLED, "")


def test_a_cancel_during_a_hung_precondition_before_sending_cancels_the_run(people, worker, monkeypatch, hung):
    """Same, for the check just before sending (the second time the precondition is asked)."""
    asked = []

    def slow_second_time(ctx, args):
        asked.append(1)
        if len(asked) > 1:
            hung.wait()
        return None

    use_tool(monkeypatch, "guarded_send2", lambda ctx, args: {}, side_effect=True, timeout_s=3600,
             precondition=slow_second_time)
    run = start_run(agent=calling("guarded2", "guarded_send2"), user=people["requester"], input="x")
    wait_until(lambda: len(asked) > 1)
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.CANCELLED, "")
    assert ToolCall.objects.get(run=run).attempts == 0  # never sent


class _Flaky:
    """A model client whose every call fails with a transient error (a 503 storm)."""

    max_retries = 3

    def __init__(self, retry_after_s):
        self.retry_after_s = retry_after_s
        self.calls = 0

    async def complete(self, request):
        self.calls += 1
        raise ModelError("HTTP 503", transient=True, retry_after_s=self.retry_after_s)


def test_a_cancel_during_the_models_retry_pause_cancels_the_run(people, worker, monkeypatch, settings):
    """A 503 with Retry-After: 1.5 s is paused inline; a cancel during the pause ends the run ``cancelled``."""
    settings.TOLLGATE = {**settings.TOLLGATE, "INLINE_BACKOFF_MAX_S": 30}
    flaky = _Flaky(retry_after_s=20)
    monkeypatch.setattr("runs.engine.loop.get_client", lambda config: flaky)
    run = start_run(agent=calling("flaky", "fake_lookup"), user=people["requester"], input="x")
    wait_until(lambda: Step.objects.filter(run=run, status="failed").exists())
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.CANCELLED, "")
    assert flaky.calls == 1


def test_a_cancel_during_a_tools_retry_pause_cancels_the_run(people, worker, monkeypatch, settings):
    """A read-only tool answers ``ToolUnavailable``; the retry is paused inline; a cancel then ends the run
    ``cancelled``."""
    from tools.registry import ToolUnavailable

    settings.TOLLGATE = {**settings.TOLLGATE, "INLINE_BACKOFF_MAX_S": 60}
    sent = []

    async def unavailable(ctx, args):
        sent.append(1)
        raise ToolUnavailable("busy")

    use_tool(monkeypatch, "busy_lookup", unavailable, backoff_s=20, max_attempts=3)
    monkeypatch.setattr("runs.base.awaiting.random.uniform", lambda a, b: b)
    run = start_run(agent=calling("busy", "busy_lookup"), user=people["requester"], input="x")
    wait_until(lambda: sent)
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.CANCELLED, "")
    assert len(sent) == 1


def test_an_async_handler_swallowing_its_cancel_does_not_hold_the_run(people, worker, monkeypatch, hung):
    """A handler that catches ``CancelledError`` and goes on (a bad library) must not keep its run past
    its timeout: the call ends at its timeout (``unknown``: a side effect), the run goes on."""

    async def stubborn(ctx, args):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            while not hung.is_set():  # ignores the cancel until the test ends
                await asyncio.sleep(0.05)
        return {}

    use_tool(monkeypatch, "stubborn_send", stubborn, side_effect=True, timeout_s=0.5)
    run = start_run(agent=calling("stubborn", "stubborn_send"), user=people["requester"], input="x")
    worker.drain(timeout_s=15)

    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert call.status == S.UNKNOWN and call.error.startswith("ToolTimeout")
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, "reconciliation")


# Runs the killed worker holds in flight at once: hundreds, as a worker of the event-loop engine does.
KILLED_IN_FLIGHT = 250


def test_a_worker_killed_with_many_transfers_in_flight_charges_each_once(people, idle_worker, short_lease, settings):
    """SIGKILL of a worker process holding ``KILLED_IN_FLIGHT`` runs, each with its transfer in flight: some
    already made by the bank, whose answer hangs (lost with the worker), the others hanging at the bank, which
    has stopped taking transfers (never made). After the sweeper every run completes, each account is paid
    exactly once under its call's key, and no run is lost."""
    import subprocess
    import sys

    from django.utils import timezone

    from runs.sweeping import sweep
    from tests.support.core import transfer_agent
    from tests.support.fake_tools import stall, transfer_keys, transfer_made_under, transfers
    from tests.support.processes import worker_environment

    # The bank makes half of the transfers it is sent, then takes no more; every answer hangs until long after
    # the kill.
    stall(made=KILLED_IN_FLIGHT // 2, seconds=600)
    accounts = [f"acct-{n}" for n in range(200_000, 200_000 + KILLED_IN_FLIGHT)]
    runs = [start_run(agent=transfer_agent(f"transfer-{account}", account), user=people["requester"],
                      input=f"transfer 10 to {account}") for account in accounts]
    ids = [r.pk for r in runs]
    # A thread per hung call (sync handlers run in TOOL_THREADS), and a timeout beyond the kill.
    env = worker_environment(FAKE_TRANSFER_TIMEOUT_S="600", TOLLGATE_TOOL_THREADS=str(KILLED_IN_FLIGHT + 16),
                             TOLLGATE_LEASE_TTL_S=str(short_lease))
    code = ("import django; django.setup(); from runs.engine.actors import advance_run; "
            "from runs.engine.runtime import engine; import time\n"
            f"for run_id in {ids}: advance_run(run_id)\n"
            "time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=settings.BASE_DIR)
    transfers_in_flight = ToolCall.objects.filter(run_id__in=ids, name="fake_transfer", status=S.RUNNING)
    try:
        wait_until(lambda: transfers_in_flight.count() == len(ids) or process.poll() is not None, timeout_s=300)
        held = Run.objects.filter(pk__in=ids, lease_expires_at__gt=timezone.now()).count()
        charged_before_kill = len(transfers())
    finally:
        process.kill()
        process.wait(10)
    assert process.returncode == -9  # it was alive, holding them, until the kill
    assert held == len(ids)
    assert 0 < charged_before_kill < len(ids)  # both kinds in flight: made (answer lost) and never made

    stall(None)  # the bank answers again
    wait_until(lambda: not Run.objects.filter(pk__in=ids, lease_expires_at__gt=timezone.now()).exists(),
               timeout_s=60)
    assert sweep()["reenqueued"] == len(ids)
    idle_worker.worker.start()
    idle_worker.drain(timeout_s=300)

    assert Counter(Run.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        RunStatus.COMPLETED: len(ids)}
    assert sorted(t["account"] for t in transfers()) == accounts
    keys = dict(ToolCall.objects.filter(run_id__in=ids, name="fake_transfer", status=S.SUCCEEDED)
                .values_list("arguments__account", "idempotency_key"))
    assert {transfer_made_under(key)["account"]: key for key in transfer_keys()} == keys


def test_an_async_handler_raising_cancelled_error_leaves_its_side_effect_unknown(people, worker, monkeypatch):
    """A handler raising ``CancelledError`` of its own (a library cancelled its own inner task): the engine
    did not cancel it, so it is an unexpected error of the tool: a side effect is ``unknown``
    (reconciled), at once, and the run is neither failed nor left for the sweeper."""

    async def self_cancelling(ctx, args):
        raise asyncio.CancelledError()

    use_tool(monkeypatch, "self_cancel_send", self_cancelling, side_effect=True, timeout_s=5)
    run = start_run(agent=calling("self-cancel", "self_cancel_send"), user=people["requester"], input="x")
    worker.drain()

    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert call.status == S.UNKNOWN and call.attempts == 1
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, "reconciliation")


def test_a_database_error_in_the_middle_of_a_step_is_retried(people, worker, monkeypatch):
    """``OperationalError`` on an engine thread between two calls (a failover): the run is looked at again
    and completes; nothing is stuck."""
    from django.db import OperationalError

    from tools.services import execution

    real = execution._key_and_reusable_result
    failures = []

    def flaky(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(execution, "_key_and_reusable_result", flaky)
    run = start_run(agent=calling("db-blip", "fake_lookup"), user=people["requester"], input="x")
    wait_until(lambda: Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED, timeout_s=20)
    worker.drain()
    assert failures == [1]


def test_a_deadline_passing_during_a_hung_precondition_fails_the_run_on_time(people, worker, monkeypatch, hung):
    """The run's deadline (1 s) passes while a precondition hangs (its tool's timeout is an hour): the run
    fails ``deadline_exceeded`` at its deadline, not an hour later nor as an internal error."""

    def slow_precondition(ctx, args):
        hung.wait()
        return None

    use_tool(monkeypatch, "guarded_late", lambda ctx, args: {}, side_effect=True, timeout_s=3600,
             precondition=slow_precondition)
    run = start_run(agent=calling("guarded-late", "guarded_late", deadline_s=1), user=people["requester"], input="x")
    wait_until(lambda: Run.objects.get(pk=run.pk).is_terminal, timeout_s=15)
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "deadline_exceeded")


def test_a_precondition_that_raises_fails_nothing_but_its_call(people, worker, monkeypatch):
    """A precondition that raises (its external system is down) does not end the run ``internal_error``:
    the call is denied with the reason, the model is told, the run goes on."""

    def broken_precondition(ctx, args):
        raise ConnectionError("gateway unreachable")

    use_tool(monkeypatch, "guarded_broken", lambda ctx, args: {}, side_effect=True, timeout_s=5,
             precondition=broken_precondition)
    run = start_run(agent=calling("guarded-broken", "guarded_broken"), user=people["requester"], input="x")
    worker.drain()

    run.refresh_from_db()
    assert run.failure_type != "internal_error"
    assert ToolCall.objects.get(run=run).attempts == 0
