"""Blame by the flight recorder (``runs.base.flight_recorder``, ``runs.engine.recovery.attribute_deaths``): what
the sweeper makes of the box a dead worker left, against the cases a reviewer found it getting wrong."""

import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import dramatiq
import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from runs import lease
from runs.base import flight_recorder
from runs.base.flight_recorder import CALL, STEP
from runs.engine.lifecycle import start_run
from runs.engine.recovery import BLAME_MARGIN, recover_after_takeover
from runs.models import DeathBlame, Run, RunStatus
from runs.sweeping import sweep
from tests.engine.test_retries_and_sweeper import _die_together
from tests.support.durability import make_agent, wait_for_lease_expiry
from tests.support.fake_tools import FAKE_CRASH_OFF_LOOP, FAKE_SLEEP
from tests.support.flight_recorder import dead_box
from tests.support.processes import worker_environment
from tools import registry
from tools.models import ToolCall, ToolCallStatus

KILLED = -signal.SIGKILL


def _runs(people, count: int) -> list[Run]:
    agent = make_agent("co-dying", [{"content": "x"}], tools=[])
    return [start_run(agent=agent, user=people["requester"], input=f"x {n}") for n in range(count)]


def _verdicts(runs) -> dict[int, str]:
    return dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "death_blame"))


def test_runs_past_sweep_max_resends_are_judged_with_the_rest_of_their_worker(people, settings):
    """A dead worker held more runs than one sweeper pass sends back: all its deaths are counted in the first
    pass, by the box, whichever pass sends each run back."""
    settings.TOLLGATE = {**settings.TOLLGATE, "SWEEP_MAX_RESENDS": 2}
    poison, *waiting = _runs(people, 4)
    owner = dead_box({poison.pk: CALL})
    started = timezone.now() - timedelta(minutes=5)  # well apart: the order of starts would blame the last
    _die_together([poison, *waiting], owner, [started + n * BLAME_MARGIN for n in (0, 1, 2, 4)])

    assert sweep()["reenqueued"] == 2
    assert _verdicts([poison, *waiting]) == {poison.pk: DeathBlame.CULPRIT,
                                             **{run.pk: DeathBlame.CLEARED for run in waiting}}
    assert sweep()["reenqueued"] == 2  # the other two, on the next pass, counted once
    assert list(Run.objects.filter(pk__in=[r.pk for r in waiting]).values_list("lost_leases", flat=True)) == [1] * 3


def test_several_runs_in_calls_are_suspects_runs_in_steps_beside_them_bystanders_the_rest_cleared(people):
    one, two, stepping, waiting = _runs(people, 4)
    owner = dead_box({one.pk: CALL, two.pk: CALL, stepping.pk: STEP})
    _die_together([one, two, stepping, waiting], owner, [timezone.now() - timedelta(minutes=5)] * 4)
    sweep()
    assert _verdicts([one, two, stepping, waiting]) == {
        one.pk: DeathBlame.SUSPECT, two.pk: DeathBlame.SUSPECT, stepping.pk: DeathBlame.BYSTANDER,
        waiting.pk: DeathBlame.CLEARED}
    counted = {pk: rest for pk, *rest in Run.objects.filter(pk__in=[one.pk, stepping.pk, waiting.pk]).values_list(
        "pk", "crash_streak", "suspect")}
    assert counted == {one.pk: [0, True], stepping.pk: [0, False], waiting.pk: [0, False]}
    held = {run.pk: lease.acquire(run.pk) for run in (one, stepping)}
    assert (held[one.pk].suspect, held[one.pk].blamed) == (True, False)  # in quarantine, with other suspects
    assert (held[stepping.pk].suspect, held[stepping.pk].blamed) == (False, False)


def test_a_run_cleared_by_the_recorder_stays_clear_until_it_dies_twice_as_often(people, settings):
    """Cleared deaths do not make a suspect at the next lease, whatever slice came between (a takeover empties
    the verdict); as many in a row as twice ISOLATE_AFTER_LOSSES do (a culprit the recorder missed)."""
    poison, victim = _runs(people, 2)
    limit = settings.TOLLGATE["ISOLATE_AFTER_LOSSES"]
    for death in range(2 * limit):
        owner = dead_box({poison.pk: CALL})
        _die_together([poison, victim], owner, [timezone.now() - timedelta(minutes=5)] * 2)
        sweep()
        victim.refresh_from_db()
        assert victim.death_blame == DeathBlame.CLEARED
        held = lease.acquire(victim.pk)
        assert held.suspect == (death == 2 * limit - 1), death
        victim.refresh_from_db()
        recover_after_takeover(victim, actor="worker", calls=[])
        lease.release(held)  # the slice ends before a model answer or a tool attempt resets the streaks
        Run.objects.filter(pk=poison.pk).update(lease_owner="", lease_expires_at=None, death_blame="")
    assert Run.objects.get(pk=victim.pk).loss_streak == 2 * limit


def test_a_bystander_of_deaths_nobody_could_be_blamed_for_is_a_suspect_after_isolate_after_losses(people, settings):
    """No box (another host): the order of starts blames nobody when starts are close, and a run that dies so
    ISOLATE_AFTER_LOSSES times in a row becomes a suspect."""
    one, two = _runs(people, 2)
    for death in range(settings.TOLLGATE["ISOLATE_AFTER_LOSSES"]):
        _die_together([one, two], f"elsewhere:{death}:x", [timezone.now() - timedelta(minutes=5)] * 2)
        sweep()
        assert _verdicts([one, two]) == {one.pk: DeathBlame.BYSTANDER, two.pk: DeathBlame.BYSTANDER}
        suspects = set(Run.objects.filter(pk__in=[one.pk, two.pk], suspect=True).values_list("pk", flat=True))
        assert suspects == (set() if death == 0 else {one.pk, two.pk})
        Run.objects.filter(pk__in=[one.pk, two.pk]).update(death_blame="")  # as their takeovers leave them


def test_a_box_of_a_process_still_running_is_not_read(people):
    """A lease can run out without a death (a long pause, a partition): what the process runs now says
    nothing, so the order of starts decides."""
    first, last = _runs(people, 2)
    started = timezone.now() - timedelta(minutes=5)
    _die_together([first, last], lease.WORKER_ID, [started, started + BLAME_MARGIN])
    flight_recorder.open_box(lease.WORKER_ID)  # this very process, alive
    sweep()
    assert _verdicts([first, last]) == {first.pk: DeathBlame.BYSTANDER, last.pk: DeathBlame.CULPRIT}


def test_a_handler_that_kills_from_its_own_task_and_to_thread_is_found(people, worker_process, monkeypatch):
    """An async handler's work in ``asyncio.to_thread`` from a task it created is noted as its call, so the run
    whose handler killed the worker is a suspect, beside a neighbour whose sync handler sleeps in its pool
    thread (also running a call's code), and neither is cleared."""
    monkeypatch.setitem(registry._TOOLS, "fake_sleep", FAKE_SLEEP)
    monkeypatch.setitem(registry._TOOLS, "fake_crash_off_loop", FAKE_CRASH_OFF_LOOP)
    sleeping = start_run(agent=make_agent("sleeping", [
        {"tool_calls": [{"name": "fake_sleep", "arguments": {"seconds": 30}}]}, {"content": "Slept."}],
        tools=["fake_sleep"]), user=people["requester"], input="sleep")
    poison = start_run(agent=make_agent("poison-off-loop", [
        {"tool_calls": [{"name": "fake_crash_off_loop", "arguments": {}}]}, {"content": "never"}],
        tools=["fake_crash_off_loop"]), user=people["requester"], input="poison")
    assert worker_process(poison.pk, tools=("fake_sleep", "fake_crash_off_loop"), first=(sleeping.pk,)) == KILLED
    assert ToolCall.objects.filter(run__in=[sleeping, poison], status=ToolCallStatus.RUNNING).count() == 2
    for run in (sleeping, poison):
        wait_for_lease_expiry(run.pk)
    sweep()
    assert _verdicts([sleeping, poison]) == {sleeping.pk: DeathBlame.SUSPECT, poison.pk: DeathBlame.SUSPECT}
    assert lease.acquire(poison.pk).suspect


def test_a_dramatiq_worker_process_that_stops_removes_its_box(people, short_lease):
    """``rundramatiq`` forks its worker processes, which leave through ``os._exit`` (no ``atexit``): the
    worker's shutdown removes the box, so a stop never leaves one behind to blame what ran as it stopped."""
    if not django_settings.REDIS_URL:
        pytest.skip("a worker process needs the Redis broker")
    dramatiq.get_broker().flush_all()
    directory = Path(django_settings.TOLLGATE["FLIGHT_RECORDER_DIR"])
    before = set(directory.glob("*.box"))
    worker = subprocess.Popen([sys.executable, "manage.py", "rundramatiq", "--processes", "1", "--threads", "1",
                               "--skip-logging"], cwd=django_settings.BASE_DIR, env=worker_environment())
    try:
        run = _runs(people, 1)[0]
        deadline = time.monotonic() + 60
        while Run.objects.get(pk=run.pk).status != RunStatus.COMPLETED:
            assert time.monotonic() < deadline, "the worker did not finish the run"
            time.sleep(0.1)
        boxes = set(directory.glob("*.box")) - before
        assert len(boxes) == 1  # the worker process's, opened by its engine
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    assert not any(box.exists() for box in boxes)
