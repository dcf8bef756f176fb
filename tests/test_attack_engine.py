"""Attacks on the engine that runs many runs per process (runs.awaiting, runs.engine.runtime).

Each test is a finding: what an adversary (a slow or misbehaving external
system, a person cancelling at the wrong moment) does, and what the run
must end as. Like tests/test_engine_runtime.py, every test uses the real
Dramatiq worker with one broker thread; hung calls wait on an event the
test sets only at its end.
"""

import asyncio
import threading

import pytest

from runs.engine.lifecycle import cancel_run, start_run
from runs.models import Run, RunStatus, Step
from runs.providers import ModelError
from tests.test_engine_runtime import calling, use_tool, wait_until
from tools.models import ToolCall, ToolCallStatus

S = ToolCallStatus


@pytest.fixture
def hung():
    release = threading.Event()
    yield release
    release.set()


def test_a_cancel_during_a_hung_precondition_cancels_the_run(demo, worker, monkeypatch, hung):
    """The precondition (a sync hook, asked at proposal) hangs; the requester cancels: the run ends
    ``cancelled``, not ``failed/internal_error`` (the hook's ``Interrupted`` is the cancel, not a bug)."""
    asked = threading.Event()

    def slow_precondition(ctx, args):
        asked.set()
        hung.wait()
        return None

    use_tool(monkeypatch, "guarded_send", lambda ctx, args: {}, side_effect=True, timeout_s=3600,
             precondition=slow_precondition)
    run = start_run(agent=calling("guarded", "guarded_send"), user=demo["requester"], input="x")
    wait_until(asked.is_set)
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.CANCELLED, "")


def test_a_cancel_during_a_hung_precondition_before_sending_cancels_the_run(demo, worker, monkeypatch, hung):
    """Same, for the check just before sending (the second time the precondition is asked)."""
    asked = []

    def slow_second_time(ctx, args):
        asked.append(1)
        if len(asked) > 1:
            hung.wait()
        return None

    use_tool(monkeypatch, "guarded_send2", lambda ctx, args: {}, side_effect=True, timeout_s=3600,
             precondition=slow_second_time)
    run = start_run(agent=calling("guarded2", "guarded_send2"), user=demo["requester"], input="x")
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


def test_a_cancel_during_the_models_retry_pause_cancels_the_run(demo, worker, monkeypatch, settings):
    """A 503 with Retry-After: 1.5 s is paused inline; a cancel during the pause ends the run ``cancelled``."""
    settings.TOLLGATE = {**settings.TOLLGATE, "INLINE_BACKOFF_MAX_S": 30}
    flaky = _Flaky(retry_after_s=20)
    monkeypatch.setattr("runs.engine.loop.get_client", lambda config: flaky)
    run = start_run(agent=calling("flaky", "fake_lookup"), user=demo["requester"], input="x")
    wait_until(lambda: Step.objects.filter(run=run, status="failed").exists())
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.CANCELLED, "")
    assert flaky.calls == 1


def test_a_cancel_during_a_tools_retry_pause_cancels_the_run(demo, worker, monkeypatch, settings):
    """A read-only tool answers ``ToolUnavailable``; the retry is paused inline; a cancel then ends the run
    ``cancelled``."""
    from tools.registry import ToolUnavailable

    settings.TOLLGATE = {**settings.TOLLGATE, "INLINE_BACKOFF_MAX_S": 60}
    sent = []

    async def unavailable(ctx, args):
        sent.append(1)
        raise ToolUnavailable("busy")

    use_tool(monkeypatch, "busy_lookup", unavailable, backoff_s=20, max_attempts=3)
    monkeypatch.setattr("tools.services.execution.random.uniform", lambda a, b: b)
    run = start_run(agent=calling("busy", "busy_lookup"), user=demo["requester"], input="x")
    wait_until(lambda: sent)
    cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")
    worker.drain()

    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.CANCELLED, "")
    assert len(sent) == 1


def test_an_async_handler_swallowing_its_cancel_does_not_hold_the_run(demo, worker, monkeypatch, hung):
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
    run = start_run(agent=calling("stubborn", "stubborn_send"), user=demo["requester"], input="x")
    worker.drain(timeout_s=15)

    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert call.status == S.UNKNOWN and call.error.startswith("ToolTimeout")
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, "reconciliation")
