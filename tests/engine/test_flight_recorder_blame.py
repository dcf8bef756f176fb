"""Blame by the flight recorder (``runs.base.flight_recorder``, ``runs.engine.recovery.attribute_deaths``): what
the sweeper makes of the box a dead worker left, against the cases a reviewer found it getting wrong."""

import signal
import subprocess
import sys
import threading
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
from runs.models import DeathBlame, Run, RunStatus, Step
from runs.sweeping import sweep
from tests.engine.test_engine_runtime import calling, hung, use_tool, wait_until  # noqa: F401 (hung: a fixture)
from tests.engine.test_retries_and_sweeper import _die_together
from tests.support.durability import make_agent, wait_for_lease_expiry
from tests.support.fake_tools import FAKE_CRASH_OFF_LOOP, FAKE_SLEEP
from tests.support.flight_recorder import box_process, dead_box
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


def test_a_dead_workers_runs_go_back_at_the_next_sweep_before_their_leases_run_out(people):
    """A worker process of this host that left its box and is gone is known dead: its runs are judged and sent
    again at the next sweep, their leases broken, with no wait for the lease TTL. A live process's runs and
    another host's (no box here to tell) keep their leases until they run out."""
    poison, waiting, live, remote = _runs(people, 4)
    owner = dead_box({poison.pk: CALL})
    process, live_owner = box_process("time.sleep(60)", wait=False)
    try:
        _die_together([poison, waiting, live, remote], owner, [timezone.now() - timedelta(minutes=5)] * 4)
        later = timezone.now() + timedelta(seconds=30)
        Run.objects.filter(pk__in=[poison.pk, waiting.pk, live.pk, remote.pk]).update(lease_expires_at=later)
        Run.objects.filter(pk=live.pk).update(lease_owner=live_owner)
        Run.objects.filter(pk=remote.pk).update(lease_owner="elsewhere:4242:abcdef")

        assert sweep()["reenqueued"] == 2
        leases = {pk: (holder, expires is not None, blame) for pk, holder, expires, blame in Run.objects.filter(
            pk__in=[poison.pk, waiting.pk, live.pk, remote.pk]).values_list(
            "pk", "lease_owner", "lease_expires_at", "death_blame")}
        assert leases == {poison.pk: ("", False, DeathBlame.CULPRIT), waiting.pk: ("", False, DeathBlame.CLEARED),
                          live.pk: (live_owner, True, ""), remote.pk: ("elsewhere:4242:abcdef", True, "")}
        assert lease.acquire(waiting.pk) is not None  # the next worker takes it at once
    finally:
        process.kill()
        process.wait()


def test_a_culprit_is_sent_back_after_the_delay_of_the_crash_streak_just_counted(people, monkeypatch):
    """The delay before a dead worker's run is tried again grows with its crash streak: the streak as this
    death left it (a culprit's first death already doubles it), not as it was read before it was counted."""
    from runs.engine import sweep_jobs

    seen = []

    def delay_ms(streak: int) -> int:
        seen.append(streak)
        return 0

    monkeypatch.setattr(sweep_jobs, "restart_delay_ms", delay_ms)
    poison, waiting = _runs(people, 2)
    owner = dead_box({poison.pk: CALL})
    _die_together([poison, waiting], owner, [timezone.now() - timedelta(minutes=5)] * 2)

    assert sweep()["reenqueued"] == 2
    assert sorted(seen) == [0, 1]  # the cleared run's streak, the culprit's (counted now)


def test_with_a_quarantine_queue_the_sweeper_sends_a_dead_workers_suspects_there(people, monkeypatch, settings):
    """The culprit goes straight to the quarantine queue, not behind the regular backlog to be sent on from it;
    the cleared run goes to the regular queue."""
    from runs.engine import sweep_jobs

    settings.TOLLGATE = {**settings.TOLLGATE, "QUARANTINE_QUEUE": "quarantine"}
    sent = {}
    monkeypatch.setattr(sweep_jobs, "wake_on_commit", lambda run_id, **options: sent.update({run_id: options}))
    poison, waiting = _runs(people, 2)
    owner = dead_box({poison.pk: CALL})
    _die_together([poison, waiting], owner, [timezone.now() - timedelta(minutes=5)] * 2)

    assert sweep()["reenqueued"] == 2
    assert {run_id: options["suspect"] for run_id, options in sent.items()} == {poison.pk: True, waiting.pk: False}


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


def test_a_dramatiq_worker_process_that_stops_says_so_in_its_box_and_the_sweeper_removes_it(people, short_lease):
    """``rundramatiq`` forks its worker processes, which leave through ``os._exit`` (no ``atexit``): the
    worker's shutdown marks its box stopped, so a stop never blames what ran as it stopped, and the sweeper
    removes the box once the process is gone and no run is leased to it."""
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
    owner, = [owner for owner in flight_recorder.dead_owners() if any(box.name.startswith(
        owner.replace(":", "_")) for box in boxes)]
    assert flight_recorder.read(owner) == {}  # stopped: it names nobody
    assert sweep()["discarded"] >= 1
    assert not any(box.exists() for box in boxes)


def test_a_dead_workers_runs_whose_leases_run_out_at_different_times_are_still_judged_by_its_box(people):
    """The keeper renews all leases every TTL/3, but a lease taken since its last beat runs out up to TTL/3
    later (acquire: now + TTL), and the run that kills its worker is often one just taken. Once the box says
    the process is gone, every run still leased to it is judged in the same pass, by the box."""
    waiting, poison = _runs(people, 2)
    owner = dead_box({poison.pk: CALL})
    _die_together([waiting, poison], owner, [timezone.now() - timedelta(minutes=5)] * 2)
    # The poison run's lease was taken after the keeper's last beat: it runs out some seconds later.
    Run.objects.filter(pk=poison.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=5))
    sweep()
    Run.objects.filter(pk=poison.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    sweep()
    verdicts = dict(Run.objects.filter(pk__in=[waiting.pk, poison.pk]).values_list("pk", "death_blame"))
    assert verdicts[poison.pk] == DeathBlame.CULPRIT
    assert Run.objects.get(pk=waiting.pk).crash_streak == 0, verdicts  # the box says it was waiting: cleared


def test_a_verdict_left_by_a_takeover_that_found_nothing_in_flight_does_not_swallow_the_next_death(people):
    """The sweeper counts a death whose holder was alive after all (a pause past the TTL: its box is not
    read; its fenced writes still land, as the break leaves the token): the holder finishes the step, and
    the next taker finds nothing in flight. The counted verdict is emptied then, so the run's next real death
    is counted again (by ``count_deaths``, which counts only rows with none)."""
    run, = _runs(people, 1)
    _die_together([run], "elsewhere:1:x", [timezone.now() - timedelta(minutes=5)])
    sweep()  # alone, by the order of starts: culprit
    run.refresh_from_db()
    assert run.death_blame == DeathBlame.CULPRIT and run.crash_streak == 1
    # The holder was only paused: it finishes the step (its fenced writes carry the unchanged token); a
    # slice's end with no model answer nor tool attempt (say, a wait) leaves the streaks as they are.
    Step.objects.filter(run=run, status=Step.Status.STARTED).update(status=Step.Status.SUCCEEDED)
    held = lease.acquire(run.pk)
    run.refresh_from_db()
    assert recover_after_takeover(run, actor="worker", calls=[]) is None  # nothing in flight
    lease.release(held)

    owner = dead_box({run.pk: CALL})  # now it really kills its worker, alone, in a call
    _die_together([run], owner, [timezone.now() - timedelta(minutes=1)])
    sweep()
    run.refresh_from_db()
    assert (run.lost_leases, run.crash_streak, run.suspect) == (2, 2, True), (
        run.lost_leases, run.crash_streak, run.suspect, run.death_blame)


def test_the_runs_a_stopped_worker_held_are_cleared(people):
    """A stop (a deploy's SIGTERM; Dramatiq stopping the siblings of a worker that died) leaves the engine's
    runs in flight to die with it: its box says it stopped, so none of them is blamed, alone or not."""
    run, = _runs(people, 1)
    process, owner = box_process("""
        with log_context.bound(99), executing(CALL):
            flight_recorder.close_box()  # stopped while a run's code ran
    """)
    assert process.returncode == 0
    _die_together([run], owner, [timezone.now() - timedelta(minutes=5)])
    sweep()
    run.refresh_from_db()
    assert (run.death_blame, run.crash_streak, run.suspect) == (DeathBlame.CLEARED, 0, False)


def test_a_suspect_that_comes_while_a_quarantine_waits_for_the_process_to_empty_joins_it(people, monkeypatch, hung):
    """Up to QUARANTINE_SIZE suspects together, so one drain serves them all: a suspect that comes while
    the quarantine waits for the process to empty joins it (the lease says it is a suspect before it waits)."""
    from runs.engine import runtime

    def stuck(ctx, args):
        hung.wait()
        return {}

    use_tool(monkeypatch, "busy_lookup", stuck, timeout_s=60)
    use_tool(monkeypatch, "gated_lookup", stuck, timeout_s=60)
    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    busy = start_run(agent=calling("busy", "busy_lookup"), user=people["requester"], input="busy")
    gated = calling("gated", "gated_lookup")
    first, second = (start_run(agent=gated, user=people["requester"], input=name) for name in ("first", "second"))
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(loss_streak=1, suspect=True)
    assert engine.submit(busy.pk) is not None
    handing_over = [threading.Thread(target=engine.submit, args=(run.pk,), daemon=True) for run in (first, second)]
    handing_over[0].start()
    wait_until(lambda: first.pk in engine.quarantine)
    handing_over[1].start()
    time.sleep(1)
    try:
        assert engine.quarantine == {first.pk, second.pk}
    finally:
        # Not in flight until busy ends: waiting for no run in flight alone could return between busy's end
        # and their start, and the test's tables be emptied under their slices (``Engine.wait_idle``).
        hung.set()
        for thread in handing_over:
            thread.join(30)
        assert engine.wait_idle(30)
        engine.close_connections()
    assert Run.objects.filter(pk__in=[busy.pk, first.pk, second.pk], status=RunStatus.COMPLETED).count() == 3


def test_suspects_that_keep_dying_together_in_calls_are_blamed_and_advanced_alone(people, settings):
    """A SUSPECT verdict counts no crash: a poison run whose death always finds a neighbour's sync handler
    blocked in its pool thread (both "in a call") is a suspect again. After ISOLATE_AFTER_LOSSES such deaths
    in a row both are blamed: each is advanced alone, so the next death is the poison run's own."""
    poison, neighbour = _runs(people, 2)
    for _ in range(settings.TOLLGATE["MAX_CRASHES_PER_STEP"]):
        owner = dead_box({poison.pk: CALL, neighbour.pk: CALL})
        _die_together([poison, neighbour], owner, [timezone.now() - timedelta(minutes=5)] * 2)
        sweep()
        for run in (poison, neighbour):  # taken over (in one quarantine, together), and dies again
            held = lease.acquire(run.pk)
            run.refresh_from_db()
            recover_after_takeover(run, actor="worker", calls=[])
            lease.release(held)
    assert all(lease.acquire(run.pk).blamed for run in (poison, neighbour)), list(
        Run.objects.filter(pk__in=[poison.pk, neighbour.pk]).values_list("death_blame", "crash_streak", "loss_streak"))


def test_a_run_whose_counted_deaths_reached_the_limit_skips_quarantine_and_ends_at_its_takeover(people, settings):
    """Its takeover ends it ``crash_loop`` before any of its code runs, so no process has to empty for it."""
    from runs.engine.loop import advance

    run, = _runs(people, 1)
    limit = settings.TOLLGATE["MAX_CRASHES_PER_STEP"]
    for death in range(limit):
        _die_together([run], dead_box({run.pk: CALL}), [timezone.now() - timedelta(minutes=5)])
        sweep()
        held = lease.acquire(run.pk)
        if death < limit - 1:
            assert held.blamed  # advanced alone...
            run.refresh_from_db()
            assert recover_after_takeover(run, actor="worker", calls=[]) is None
        lease.release(held)
    assert not held.suspect  # ...until the last death counted: nothing of it runs again
    advance(run.pk)
    run.refresh_from_db()
    assert (run.status, run.failure_type, run.crash_streak) == (RunStatus.FAILED, "crash_loop", limit)
