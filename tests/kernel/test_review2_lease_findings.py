"""Review of 16fc00d/ff87fec (the lease keeper counting from ``Lease.taken_at``; the lease's FOR UPDATE subquery):
failing tests, each a lease that runs out while its holder keeps it."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from runs import lease
from runs.engine.lifecycle import start_run
from runs.models import Run
from tests.support.durability import lookup_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(people):
    return start_run(agent=lookup_agent(), user=people["requester"], input="look a up")


def _expire(run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _waiting_for_a_lock(watcher) -> int:
    with watcher.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND query LIKE '%%UPDATE%%runs_run%%'")
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and concurrent statements: PostgreSQL")
def test_a_lease_whose_statement_waited_for_the_row_is_renewed_before_it_runs_out(run, settings):
    """``acquire`` sets ``lease_expires_at = now + TTL`` with ``now`` read *before* its statement, but the
    ``Lease`` (and so ``taken_at``, from which the keeper counts the first renewal) is built *after* the
    statement, which may wait for the run's row (another transaction holds it: the old holder's group commit,
    the sweeper, a ``locked`` writer; since 16fc00d also any transaction that inserted a row referencing the
    run, as ``FOR UPDATE`` conflicts with the foreign key's ``FOR KEY SHARE``). A wait of more than two thirds of
    the TTL puts the first renewal (taken_at + TTL/3) after the expiry: the lease runs out while held in the
    keeper and another worker takes the run over."""
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
    """The keeper plans each renewal with the TTL as it is at that beat (``_third_of_ttl()``), but a lease runs
    out after the TTL it was taken with (``acquire``: ``now + ttl()``). A lease taken under a short TTL and kept
    while the setting grows (``override_settings`` in a test, a settings reload) is first renewed a third of the
    *new* TTL after it was taken: past its expiry, so another worker takes it while held."""
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 1.5}
    held = lease.acquire(run.pk, owner="worker-a")
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 9.0}
    with lease.kept(held):
        time.sleep(1.8)  # past the 1.5 s the lease was taken for, under a third of the new TTL
        assert lease.acquire(run.pk, owner="worker-b") is None, "the lease ran out while its holder kept it"
