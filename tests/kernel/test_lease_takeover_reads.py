"""A run read with its lease, and the keeper: what a takeover must see, and a lease held all along never runs out."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from runs import lease
from runs.engine.lifecycle import start_run
from runs.models import Phase, Run, Step
from tests.support.durability import lookup_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(people):
    return start_run(agent=lookup_agent(), user=people["requester"], input="look a up")


def _expire(run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _take_while_the_row_is_held(run_id: int, hold) -> lease.Lease:
    """``acquire(reading=RUN_READING)`` by worker-b, started while ``hold()`` (in this thread, in a transaction)
    holds the run's row; returns the lease once that transaction committed."""
    from runs.engine.loop import RUN_READING

    taken, watcher = {}, connections.create_connection(DEFAULT_DB_ALIAS)

    def take():
        try:
            taken["held"] = lease.acquire(run_id, owner="worker-b", reading=RUN_READING)
        finally:
            connection.close()

    def waiting_for_the_row() -> int:
        with watcher.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND query LIKE 'WITH written AS (UPDATE %%'")
            return cursor.fetchone()[0]

    taker = threading.Thread(target=take)
    try:
        with transaction.atomic():
            hold()
            taker.start()
            deadline = time.monotonic() + 20
            while not waiting_for_the_row():
                assert time.monotonic() < deadline, "the lease's statement never waited for the row"
                time.sleep(0.02)
    finally:
        taker.join()
        watcher.close()
    return taken["held"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and concurrent statements: PostgreSQL")
def test_a_model_step_started_by_the_old_holder_while_the_lease_waited_is_seen(run):
    """The engine starts a model step with ``set_phase(run, CALLING_MODEL, insert=step)`` (loop._model_turn): a
    fenced UPDATE of the run's phase and the step's INSERT, *no event*, so ``last_event_seq`` does not move. A
    worker whose lease ran out (stalled past its TTL, its keeper's renewals failing) does that while another
    takes the lease over: the taker's statement waits for the row, then reads the steps from a snapshot that
    predates the step, and the staleness check (seq moved?) passes. The slice then thinks nothing is in flight
    (recover_after_takeover(steps=[])): the old holder's death is not counted now and its STARTED step is left
    behind, to be found (and blamed on the run) by a later slice. ``RUN_READING.one`` right after sees it."""
    from runs.engine.loop import RUN_READING
    from runs.services import set_phase

    old = lease.acquire(run.pk, owner="worker-a")
    _expire(run.pk)  # worker-a stalls past its lease; it is about to start a model step

    def start_a_step():
        reset = lease._current.set(old)  # worker-a's context: its writes are fenced by its token
        try:
            set_phase(Run.objects.get(pk=run.pk), Phase.CALLING_MODEL, insert=Step(run=run, index=0))
        finally:
            lease._current.reset(reset)

    held = _take_while_the_row_is_held(run.pk, start_a_step)
    assert held is not None and held.owner == "worker-b"
    assert Step.objects.filter(run=run, status=Step.Status.STARTED).exists()  # the old holder's step landed
    assert RUN_READING.one(run.pk).steps_in_flight  # as the slice would have read it before 2e0095b
    assert held.run.steps_in_flight, "the step in flight was missed: the snapshot predates it, seq did not move"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and concurrent statements: PostgreSQL")
def test_a_takeover_whose_old_holder_started_a_step_meanwhile_counts_the_death(run):
    """The consequence through the slice: taking over from a holder that started a model step while the lease
    waited, the slice discards that step and counts the death (``recovery``), as it did before 2e0095b."""
    from runs.engine.loop import advance_slice
    from runs.services import set_phase

    with lease.holding(lease.acquire(run.pk, owner="worker-0")):  # the run has started (RUNNING)
        from runs.engine.lifecycle import begin_run
        begin_run(Run.objects.get(pk=run.pk), actor="test")
    old = lease.acquire(run.pk, owner="worker-a")
    _expire(run.pk)

    def start_a_step():
        reset = lease._current.set(old)
        try:
            set_phase(Run.objects.get(pk=run.pk), Phase.CALLING_MODEL, insert=Step(run=run, index=0))
        finally:
            lease._current.reset(reset)

    held = _take_while_the_row_is_held(run.pk, start_a_step)
    assert held is not None
    with lease.kept(held):
        steps = advance_slice(run.pk, held.run)
        next(steps)  # up to its first call or commit point: the takeover's recovery is done by then
        steps.close()
    step = Step.objects.get(run=run, index=0)
    assert step.status == Step.Status.DISCARDED, "the dead holder's step was left started"
    assert Run.objects.get(pk=run.pk).lost_leases == 1


def test_a_lease_held_in_the_keeper_all_along_never_runs_out(run, settings):
    """``renewed``/``kept`` promise the keeper renews the lease until the block ends. Since acb719b a wake (the
    first lease after none) renews nothing and restarts the wait, so a lease that leaves and re-enters the
    keeper (runtime: renewed during a quarantine wait, kept in _first_work, kept again in _advance) each time
    just before its beat is never renewed, and runs out while held: another worker takes it. (The runtime's own
    path re-enters at most twice per lease after its quarantine wait, which leaves a margin near zero, not
    below it; the keeper's promise is broken for any caller that re-enters a third time.)"""
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 1.5}
    held = lease.acquire(run.pk, owner="worker-a")
    started = time.monotonic()
    while time.monotonic() - started < 2.0:  # past the TTL, held throughout but for an instant every 0.3 s
        with lease.renewed(held):
            time.sleep(0.3)
    assert lease.acquire(run.pk, owner="worker-b") is None, "the lease ran out while its holder kept it"
