"""Review of d964499 (the flight recorder): cases where the sweeper's blame goes wrong."""

import socket
from datetime import timedelta

from django.utils import timezone

from runs.base import flight_recorder
from runs.base.flight_recorder import _HEADER, _MAGIC, _SIZE, _SLOT, _VERSION, CALL
from runs.models import DeathBlame, Run
from runs.sweeping import sweep
from runs.engine.lifecycle import start_run
from runs.engine.recovery import BLAME_MARGIN
from tests.support.durability import make_agent, wait_for_lease_expiry
from tests.engine.test_retries_and_sweeper import _die_together


def _box(owner: str, running: dict[int, int]) -> None:
    """The box a process of lease owner ``owner`` leaves when SIGKILLed with its threads running ``running``."""
    data = bytearray(_SIZE)
    _HEADER.pack_into(data, 0, _MAGIC, _VERSION, 0, owner.encode())
    for slot, (run_id, kind) in enumerate(running.items()):
        _SLOT.pack_into(data, _HEADER.size + slot * _SLOT.size, run_id, kind)
    path = flight_recorder.box_path(owner)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(data))


def test_runs_past_sweep_max_resends_keep_the_recorders_verdict(people, settings):
    """A dead worker held more runs than one sweeper pass sends back (RUNS_IN_FLIGHT 1000 > SWEEP_MAX_RESENDS
    500 by default). Its box names the poison run; every other run was waiting for an answer and is cleared
    in the first pass. The runs left for the next pass must be cleared too, not judged by the order of starts
    against a box that no longer names any of them."""
    settings.TOLLGATE = {**settings.TOLLGATE, "SWEEP_MAX_RESENDS": 2}
    agent = make_agent("co-dying", [{"content": "x"}], tools=[])
    poison, *waiting = (start_run(agent=agent, user=people["requester"], input=f"x {n}") for n in range(4))
    owner = f"{socket.gethostname()}:999999:review"
    started = timezone.now() - timedelta(minutes=5)
    # The waiting runs' calls started one after the other, well apart (as a slow trickle of starts would).
    _die_together([poison, *waiting], owner,
                  [started, started + BLAME_MARGIN, started + 2 * BLAME_MARGIN, started + 4 * BLAME_MARGIN])
    _box(owner, {poison.pk: CALL})

    assert sweep()["reenqueued"] == 2  # the poison run (untouched longest) and one other
    assert sweep()["reenqueued"] == 2  # the other two, on the next pass
    verdicts = dict(Run.objects.filter(pk__in=[r.pk for r in (poison, *waiting)]).values_list("pk", "death_blame"))
    assert verdicts == {poison.pk: DeathBlame.CULPRIT, **{r.pk: DeathBlame.CLEARED for r in waiting}}


def test_a_run_whose_handler_kills_from_to_thread_is_not_cleared(people, worker_process, monkeypatch):
    """An async handler that kills its worker from ``asyncio.to_thread`` (or a task it creates, or
    ``asyncio.wait_for`` on 3.11) runs its code where the recorder does not look. The box then names only a
    neighbour whose sync handler sleeps in its pool thread: the neighbour is blamed and the run that killed
    the worker is CLEARED (never a suspect, its attempts spared), so it goes on killing workers."""
    from runs import lease
    from tests.support.fake_tools import FAKE_CRASH_OFF_LOOP, FAKE_SLEEP
    from tools import registry
    from tools.models import ToolCall, ToolCallStatus

    monkeypatch.setitem(registry._TOOLS, "fake_sleep", FAKE_SLEEP)
    monkeypatch.setitem(registry._TOOLS, "fake_crash_off_loop", FAKE_CRASH_OFF_LOOP)
    sleeping_agent = make_agent("sleeping", [{"tool_calls": [{"name": "fake_sleep", "arguments": {"seconds": 30}}]},
                                             {"content": "Slept."}], tools=["fake_sleep"])
    poison_agent = make_agent("poison-off-loop", [{"tool_calls": [{"name": "fake_crash_off_loop", "arguments": {}}]},
                                                  {"content": "never"}], tools=["fake_crash_off_loop"])
    sleeping = start_run(agent=sleeping_agent, user=people["requester"], input="sleep")
    poison = start_run(agent=poison_agent, user=people["requester"], input="poison")
    assert worker_process(poison.pk, tools=("fake_sleep", "fake_crash_off_loop"), first=(sleeping.pk,)) == -9
    assert ToolCall.objects.filter(run__in=[sleeping, poison], status=ToolCallStatus.RUNNING).count() == 2
    owner = Run.objects.get(pk=poison.pk).lease_owner
    assert flight_recorder.read(owner) == {sleeping.pk: CALL}  # the poison run's code is nowhere in the box
    for run in (sleeping, poison):
        wait_for_lease_expiry(run.pk)
    sweep()
    verdicts = dict(Run.objects.filter(pk__in=[sleeping.pk, poison.pk]).values_list("pk", "death_blame"))
    assert verdicts[poison.pk] != DeathBlame.CLEARED, verdicts
    assert lease.acquire(poison.pk).suspect


def _exit_normally_after_opening(owner: str) -> None:
    flight_recorder._box = None  # as in a fresh worker process
    flight_recorder.open_box(owner)


def test_a_dramatiq_worker_process_that_exits_removes_its_box(settings, tmp_path):
    """``dramatiq`` (and so ``rundramatiq``) starts its worker processes with multiprocessing's fork, whose
    children leave through ``os._exit``: ``atexit`` handlers never run, so the box stays behind after every
    graceful stop (and is never removed on a host without a sweeper, or in a directory shared between hosts)."""
    import multiprocessing

    settings.TOLLGATE = {**settings.TOLLGATE, "FLIGHT_RECORDER_DIR": str(tmp_path)}
    owner = f"{socket.gethostname()}:0:fork"
    child = multiprocessing.get_context("fork").Process(target=_exit_normally_after_opening, args=(owner,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert not flight_recorder.box_path(owner).exists()


def test_a_run_cleared_by_the_recorder_stays_clear_after_its_takeover(people):
    """A run cleared twice in a row (loss_streak 2, the last death CLEARED) is not a suspect when it is
    taken over; but the takeover empties death_blame, so if that slice ends before any progress resets the
    streaks (its side-effecting call went unknown and waits for a person, a long backoff became a timer,
    a transient model error...), the next lease on it makes it a suspect all the same."""
    from runs import lease
    from runs.engine.recovery import recover_after_takeover

    agent = make_agent("co-dying", [{"content": "x"}], tools=[])
    poison, victim = (start_run(agent=agent, user=people["requester"], input=f"x {n}") for n in range(2))
    for death in range(2):
        owner = f"{socket.gethostname()}:99999{death}:review"
        started = timezone.now() - timedelta(minutes=5)
        _die_together([poison, victim], owner, [started, started])
        _box(owner, {poison.pk: CALL})
        sweep()
        victim.refresh_from_db()
        assert victim.death_blame == DeathBlame.CLEARED
        held = lease.acquire(victim.pk)
        assert not held.suspect  # cleared: not a suspect...
        victim.refresh_from_db()
        recover_after_takeover(victim, actor="worker", calls=[])
        lease.release(held)  # ...the slice ends before a model answer or a tool attempt resets the streaks
        Run.objects.filter(pk=poison.pk).update(lease_owner="", lease_expires_at=None)
    victim.refresh_from_db()
    assert victim.loss_streak == 2
    assert not lease.acquire(victim.pk).suspect  # ...but the next lease on it: a suspect after all


def test_a_fifo_planted_in_the_box_directory_does_not_hang_the_sweeper(settings, tmp_path):
    """The default directory is a fixed name in the shared temp directory (/tmp/tollgate-flight-recorder),
    used as found (mkdir exist_ok, no owner or mode check). Whoever created it first (another local user)
    can put anything in it; a FIFO under a box's name (no lease owner's nonce needed: any dead pid will do)
    blocks ``dead_owners``'s read for ever, and with it every later sweep job of that sweeper."""
    import os
    import threading

    settings.TOLLGATE = {**settings.TOLLGATE, "FLIGHT_RECORDER_DIR": str(tmp_path)}
    host = flight_recorder._file_name(socket.gethostname()).removesuffix(".box")
    os.mkfifo(tmp_path / f"{host}_999999_planted.box")
    done = threading.Event()
    threading.Thread(target=lambda: (flight_recorder.dead_owners(), done.set()), daemon=True).start()
    assert done.wait(5), "dead_owners() is stuck reading a FIFO"
