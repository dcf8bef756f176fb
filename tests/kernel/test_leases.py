"""Leases and fencing tokens: one worker advances a run; a stale one changes nothing."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from runs import lease
from runs.lease import LeaseLost
from runs.models import Phase, Run, RunStatus, Step
from runs.services import append_event
from runs.transitions import apply
from runs.engine.lifecycle import start_run
from runs.engine.loop import RUN_READING
from tests.support.durability import lookup_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(people):
    return start_run(agent=lookup_agent(), user=people["requester"], input="look a up")


def _expire(run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _waiting_for_a_lock(watcher) -> int:
    """How many statements updating a run's row wait for a lock now (read on ``watcher``, a connection of its own)."""
    with watcher.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND query LIKE '%%UPDATE%%runs_run%%'")
        return cursor.fetchone()[0]


def test_only_one_of_two_racing_workers_gets_the_lease(run):
    first = lease.acquire(run.pk, owner="worker-a")
    second = lease.acquire(run.pk, owner="worker-b")
    assert first is not None and second is None
    assert Run.objects.get(pk=run.pk).lease_owner == "worker-a"


def test_token_grows_with_every_acquisition(run):
    first = lease.acquire(run.pk, owner="worker-a")
    _expire(run.pk)
    second = lease.acquire(run.pk, owner="worker-b")
    assert second.token == first.token + 1


def test_worker_that_lost_its_lease_can_change_nothing(run):
    stale = lease.acquire(run.pk, owner="worker-a")
    _expire(run.pk)  # worker-a is paused past its lease...
    fresh = lease.acquire(run.pk, owner="worker-b")  # ...and worker-b takes over
    events_before = Run.objects.get(pk=run.pk).last_event_seq

    with lease.holding(stale):
        with pytest.raises(LeaseLost):
            apply(Run.objects.get(pk=run.pk).start, actor="worker-a")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert run.last_event_seq == events_before
    assert run.lease_token == fresh.token

    with lease.holding(fresh):
        apply(Run.objects.get(pk=run.pk).start, actor="worker-b")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert run.events.last().actor == "worker-b"


def test_releasing_a_lease_lets_the_next_worker_in_at_once(run):
    held = lease.acquire(run.pk, owner="worker-a")
    with lease.holding(held):
        assert lease.acquire(run.pk, owner="worker-b") is None
    assert lease.acquire(run.pk, owner="worker-b") is not None


def test_writes_outside_any_lease_are_not_fenced(run):
    """People (approvals, cancel) act without a lease; their writes are guarded by the FSM instead."""
    lease.acquire(run.pk, owner="worker-a")
    from django.db import transaction

    with transaction.atomic():
        append_event(run, type="note", actor="user:approver")
    assert run.events.filter(type="note").count() == 1


def test_heartbeat_keeps_a_long_call_leased(run, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 0.3}
    held = lease.acquire(run.pk, owner="worker-a")
    import time

    with lease.holding(held):
        time.sleep(0.9)  # three TTLs: only the heartbeat keeps the lease alive
        assert Run.objects.get(pk=run.pk).lease_expires_at > timezone.now()
        assert lease.acquire(run.pk, owner="worker-b") is None


def test_a_lease_just_taken_is_renewed_a_third_of_the_ttl_later_not_at_once(run, settings):
    """The keeper, woken by a process's first lease after none, renews nothing then: the lease is fresh, and a
    statement at that moment would only slow the run's first steps."""
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 1.5}
    held = lease.acquire(run.pk, owner="worker-a")
    taken_until = Run.objects.get(pk=run.pk).lease_expires_at
    with lease.holding(held):
        time.sleep(0.25)
        assert Run.objects.get(pk=run.pk).lease_expires_at == taken_until
        time.sleep(0.5)  # past a third of the TTL: renewed by now
        assert Run.objects.get(pk=run.pk).lease_expires_at > taken_until


def test_stale_worker_cannot_even_start_a_model_step(run):
    from runs.engine.loop import _model_turn
    from runs.engine.state import Known

    stale = lease.acquire(run.pk, owner="worker-a")
    apply(Run.objects.get(pk=run.pk).start, actor="worker-a")
    _expire(run.pk)
    lease.acquire(run.pk, owner="worker-b")
    with lease.holding(stale):
        with pytest.raises(LeaseLost):
            stale_run = Run.objects.select_related("agent").get(pk=run.pk)
            next(_model_turn(stale_run, Known(stale_run)))  # the step's first write, before the model is asked
    assert not run.steps.exists()


@pytest.mark.parametrize("crash_streak, marked, suspect, blamed", [(0, False, False, False), (0, True, True, False),
                                                                   (1, True, True, True)])
def test_a_lease_says_whether_the_run_is_a_suspect_and_whether_it_was_blamed(crash_streak, marked, suspect, blamed,
                                                                            run):
    """What the sweeper (or a takeover) left on the run: a suspect is advanced in quarantine, a blamed one alone."""
    Run.objects.filter(pk=run.pk).update(crash_streak=crash_streak, suspect=marked)
    held = lease.acquire(run.pk, owner="worker-a")
    assert (held.suspect, held.blamed) == (suspect, blamed)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and concurrent statements: PostgreSQL")
def test_of_two_workers_whose_statements_both_saw_the_expired_lease_only_one_takes_it(run):
    """Both UPDATEs start while a third session holds the row (so both read the lease as expired, the
    replaced lease included) and run once it lets go: the second one re-reads the row the first wrote and
    takes nothing."""
    lease.acquire(run.pk, owner="dead")
    _expire(run.pk)
    taken, watcher = {}, connections.create_connection(DEFAULT_DB_ALIAS)

    def take(owner):
        try:
            taken[owner] = lease.acquire(run.pk, owner=owner)
        finally:
            connection.close()

    racers = [threading.Thread(target=take, args=(owner,)) for owner in ("worker-a", "worker-b")]
    try:
        with transaction.atomic():
            Run.objects.select_for_update().get(pk=run.pk)
            for racer in racers:
                racer.start()
            deadline = time.monotonic() + 20
            while _waiting_for_a_lock(watcher) < 2:
                assert time.monotonic() < deadline, "the two acquisitions never both waited for the row"
                time.sleep(0.02)
    finally:
        for racer in racers:
            racer.join()
        watcher.close()
    winners = [owner for owner, held in taken.items() if held is not None]
    assert len(taken) == 2 and len(winners) == 1
    assert taken[winners[0]].suspect  # it replaced a lease nobody gave back
    assert Run.objects.get(pk=run.pk).lease_owner == winners[0]


def test_a_lease_taken_with_a_reading_brings_the_run_as_a_slice_reads_it(run):
    """The run, its agent, session and requester and its flags come with the lease: on PostgreSQL in the
    lease's own statement, as the slice would read them after it."""
    from django.test.utils import CaptureQueriesContext


    with CaptureQueriesContext(connection) as statements:
        held = lease.acquire(run.pk, owner="worker-a", reading=RUN_READING)
    read = RUN_READING.one(run.pk)
    columns = [field.attname for field in Run._meta.concrete_fields]
    assert [getattr(held.run, name) for name in columns] == [getattr(read, name) for name in columns]
    assert (held.run.lease_owner, held.run.lease_token) == ("worker-a", held.token)
    for name in ("agent", "session", "requested_by"):
        assert name in held.run._state.fields_cache and getattr(held.run, name) == getattr(read, name)
    assert held.run.steps_in_flight is False
    if connection.vendor == "postgresql":
        assert len(statements) == 1
    assert lease.acquire(run.pk, owner="worker-b", reading=RUN_READING) is None


@pytest.mark.skipif(connection.vendor == "postgresql", reason="on PostgreSQL the run is read in the lease's statement")
def test_a_run_deleted_between_its_lease_and_its_reading_is_not_taken(run, monkeypatch):
    from runs.base import selects

    read = selects.Reading.one

    def deleted_first(reading, pk):
        Run.objects.filter(pk=pk).delete()
        return read(reading, pk)

    monkeypatch.setattr(selects.Reading, "one", deleted_first)
    assert lease.acquire(run.pk, owner="worker-a", reading=RUN_READING) is None


def _take_while_the_row_is_held(run_id: int, hold) -> lease.Lease:
    """``acquire(reading=RUN_READING)`` by worker-b, started while ``hold()`` (in this thread, in a transaction)
    holds the run's row; returns the lease once that transaction committed."""

    taken, watcher = {}, connections.create_connection(DEFAULT_DB_ALIAS)

    def take():
        try:
            taken["held"] = lease.acquire(run_id, owner="worker-b", reading=RUN_READING)
        finally:
            connection.close()

    taker = threading.Thread(target=take)
    try:
        with transaction.atomic():
            hold()
            taker.start()
            deadline = time.monotonic() + 20
            while not _waiting_for_a_lock(watcher):
                assert time.monotonic() < deadline, "the lease's statement never waited for the row"
                time.sleep(0.02)
    finally:
        taker.join()
        watcher.close()
    return taken["held"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and concurrent statements: PostgreSQL")
def test_a_run_changed_while_its_lease_waited_for_the_row_is_read_afresh(run):
    """The lease's statement starts while another transaction holds the run's row and starts a step of it; once
    that commits, the row as written is the new one but the statement's snapshot (its flags, its related rows)
    is not, so the run is read again: the step in flight is seen."""
    from django.db.models import F

    def start_a_step():
        Run.objects.select_for_update().get(pk=run.pk)
        Step.objects.create(run=run, index=0, status=Step.Status.STARTED)
        Run.objects.filter(pk=run.pk).update(last_event_seq=F("last_event_seq") + 1)

    held = _take_while_the_row_is_held(run.pk, start_a_step)
    assert held.run.steps_in_flight
    assert held.run.last_event_seq == Run.objects.get(pk=run.pk).last_event_seq


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and concurrent statements: PostgreSQL")
def test_a_model_step_started_by_the_old_holder_while_the_lease_waited_is_seen(run):
    """The engine starts a model step with ``set_phase(run, CALLING_MODEL, insert=step)`` (loop._model_turn): a
    fenced UPDATE of the run's phase and the step's INSERT, *no event*, so ``last_event_seq`` does not move. A
    worker whose lease ran out (stalled past its TTL, its keeper's renewals failing) does that while another
    takes the lease over: the taker's statement waits for the row, then reads the steps from a snapshot that
    predates the step, and the staleness check (seq moved?) passes. The slice then thinks nothing is in flight
    (recover_after_takeover(steps=[])): the old holder's death is not counted now and its STARTED step is left
    behind, to be found (and blamed on the run) by a later slice. ``RUN_READING.one`` right after sees it."""
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


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and concurrent statements: PostgreSQL")
def test_a_lease_whose_statement_waited_for_the_row_is_renewed_before_it_runs_out(run, settings):
    """``acquire`` sets ``lease_expires_at = now + TTL`` with ``now`` read *before* its statement, but the
    ``Lease`` (and so ``taken_at``, from which the keeper counts the first renewal) is built *after* the
    statement, which may wait for the run's row (another transaction holds it: the old holder's group commit,
    the sweeper, a ``locked`` writer). A wait of more than two thirds of the TTL put the first renewal
    (taken_at + TTL/3) after the expiry: the lease ran out while held in the keeper and another worker took the
    run over. ``taken_at`` is now read before the statement, with the ``now`` the expiry counts from."""
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 3.0}
    lease.acquire(run.pk, owner="worker-a")
    _expire(run.pk)  # worker-a's lease ran out: worker-b may take the run
    taken, watcher = {}, connections.create_connection(DEFAULT_DB_ALIAS)

    def take():
        try:
            taken["held"] = lease.acquire(run.pk, owner="worker-b")
        finally:
            connection.close()

    taker = threading.Thread(target=take)
    try:
        with transaction.atomic():
            list(Run.objects.select_for_update().filter(pk=run.pk).values_list("pk"))  # a writer holds the row
            taker.start()
            deadline = time.monotonic() + 20
            while not _waiting_for_a_lock(watcher):
                assert time.monotonic() < deadline, "the lease's statement never waited for the row"
                time.sleep(0.02)
            time.sleep(2.3)  # the writer's transaction is slow (under the TTL, over two thirds of it)
    finally:
        taker.join()
        watcher.close()
    held = taken["held"]
    assert held is not None and held.owner == "worker-b"
    expires = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
    with lease.kept(held):  # worker-b keeps its lease from the moment it has it
        time.sleep(max(0.0, (expires - timezone.now()).total_seconds()) + 0.1)
        assert lease.acquire(run.pk, owner="worker-c") is None, "the lease ran out while its holder kept it"


def test_a_lease_kept_while_the_ttl_grows_is_renewed_before_it_runs_out(run, settings):
    """A lease runs out after the TTL it was taken with (``Lease.ttl_s``); the keeper planned with the TTL as it
    was at each beat, so a lease taken under a short TTL and kept while the setting grew (``override_settings``
    in a test) was first renewed a third of the *new* TTL after it was taken: past its expiry."""
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 1.5}
    held = lease.acquire(run.pk, owner="worker-a")
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 9.0}
    with lease.kept(held):
        time.sleep(1.8)  # past the 1.5 s the lease was taken for, under a third of the new TTL
        assert lease.acquire(run.pk, owner="worker-b") is None, "the lease ran out while its holder kept it"
