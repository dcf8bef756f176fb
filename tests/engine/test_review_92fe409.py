"""Review of 92fe409: failing cases in death counting and the quarantine."""

import threading
import time
from datetime import timedelta

from django.utils import timezone

from runs import lease
from runs.base.flight_recorder import CALL
from runs.engine.lifecycle import start_run
from runs.engine.recovery import recover_after_takeover
from runs.models import DeathBlame, Run, Step
from runs.sweeping import sweep
from tests.engine.test_engine_runtime import calling, hung, use_tool, wait_until  # noqa: F401 (hung: a fixture)
from tests.engine.test_retries_and_sweeper import _die_together
from tests.support.durability import make_agent
from tests.support.flight_recorder import box_process, dead_box


def _runs(people, count: int) -> list[Run]:
    agent = make_agent("co-dying", [{"content": "x"}], tools=[])
    return [start_run(agent=agent, user=people["requester"], input=f"x {n}") for n in range(count)]


def test_a_dead_workers_runs_whose_leases_run_out_at_different_times_are_still_judged_by_its_box(people):
    """The keeper renews all leases every TTL/3, but a lease taken since its last beat runs out up to TTL/3
    later (acquire: now + TTL). The run that kills its worker is typically one just taken. A sweeper pass
    in between judges the others without it: the box names none of them, so the order of starts decides,
    and a run the box shows waiting for an answer is blamed (alone in the pass: CULPRIT)."""
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
    the next taker's ``recover_after_takeover`` finds nothing in flight and returns early, leaving
    ``death_blame`` set. The run's next real death is then never counted: ``count_deaths`` skips rows whose
    ``death_blame`` is not empty, ``acquire`` does not see the lease as abandoned, and the takeover reuses
    the stale verdict."""
    run, = _runs(people, 1)
    _die_together([run], "elsewhere:1:x", [timezone.now() - timedelta(minutes=5)])
    sweep()  # alone, by the order of starts: culprit
    run.refresh_from_db()
    assert run.death_blame == DeathBlame.CULPRIT and run.crash_streak == 1
    # The holder was only paused: it finishes the step (its fenced writes carry the unchanged token) and the
    # model answer resets the streaks and the suspect flag, not death_blame.
    Step.objects.filter(run=run, status=Step.Status.STARTED).update(status=Step.Status.SUCCEEDED)
    Run.objects.filter(pk=run.pk).update(crash_streak=0, loss_streak=0, suspect=False)
    held = lease.acquire(run.pk)
    run.refresh_from_db()
    assert recover_after_takeover(run, actor="worker", calls=[]) is None  # nothing in flight
    lease.release(held)

    owner = dead_box({run.pk: CALL})  # now it really kills its worker, alone, in a call
    _die_together([run], owner, [timezone.now() - timedelta(minutes=1)])
    sweep()
    run.refresh_from_db()
    assert (run.lost_leases, run.crash_streak, run.suspect) == (2, 1, True), (
        run.lost_leases, run.crash_streak, run.suspect, run.death_blame)


def test_a_stopped_worker_whose_box_is_removed_blames_the_run_it_held(people):
    """docs/design.md: "A worker that stops removes its box ..., so a stop blames nobody". Without a box the
    order of starts decides, and a run that died alone is the culprit: a stop (a deploy's SIGTERM, the engine's
    runs still in flight: nothing waits for them) counts a crash against the run."""
    run, = _runs(people, 1)
    process, owner = box_process("flight_recorder.close_box()")  # stopped cleanly: its box removed
    assert process.returncode == 0
    _die_together([run], owner, [timezone.now() - timedelta(minutes=5)])
    sweep()
    run.refresh_from_db()
    assert (run.death_blame, run.crash_streak) != (DeathBlame.CULPRIT, 1)


def test_a_suspect_that_comes_while_a_quarantine_waits_for_the_process_to_empty_joins_it(people, monkeypatch, hung):
    """docs/design.md "Quarantine": up to QUARANTINE_SIZE suspects together, "so one drain serves them all".
    But ``_take`` makes every submit wait for the quarantine to be empty *before* it knows the run is a
    suspect: a second suspect that comes while the first waits for the drain cannot join; it waits for the
    first one's whole slice (and a drain of its own), and only suspects whose leases were taken in the same
    instant ever share a quarantine."""
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
    threading.Thread(target=engine.submit, args=(first.pk,), daemon=True).start()
    wait_until(lambda: first.pk in engine.quarantine)
    threading.Thread(target=engine.submit, args=(second.pk,), daemon=True).start()
    time.sleep(1)
    try:
        assert engine.quarantine == {first.pk, second.pk}
    finally:
        hung.set()
        assert engine.wait_idle(30)
        engine.close_connections()


def test_two_runs_that_keep_dying_in_calls_together_are_never_blamed_nor_separated(people, settings):
    """A SUSPECT verdict counts no crash, and nothing escalates it: a poison run whose death always finds a
    neighbour's sync handler blocked in its pool thread (both "in a call") is a suspect again and again,
    never blamed, so never advanced alone and never ended by MAX_CRASHES_PER_STEP; the neighbour's losses
    grow with it until MAX_LOSSES_PER_STEP ends both. docs/design.md: "A poison run dies alone, is blamed
    alone"."""
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
    assert any(lease.acquire(run.pk).blamed for run in (poison, neighbour)), list(
        Run.objects.filter(pk__in=[poison.pk, neighbour.pk]).values_list("death_blame", "crash_streak", "loss_streak"))
