"""Group commit (runs.engine.group_commit): several runs' work in one transaction, each run's failure its own.

Each test holds the committer's only thread with a first job until the
jobs under test are queued, so those are taken together, as one group.
"""

import threading

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError

from runs import lease
from runs.engine.group_commit import GroupCommit
from runs.engine.lifecycle import start_run
from runs.lease import LeaseLost
from runs.models import Run, RunStatus
from runs.transitions import apply
from tests.support.durability import lookup_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def committer():
    group_commit = GroupCommit(threads=1, max_group=8)
    yield group_commit
    group_commit.close_connections()


@pytest.fixture
def runs(people):
    agent = lookup_agent()
    return [start_run(agent=agent, user=people["requester"], input=f"look {n} up") for n in range(3)]


def held_back(committer: GroupCommit) -> threading.Event:
    """Occupy the committer's thread until the returned event is set."""
    release = threading.Event()
    committer.submit(release.wait, 10)
    return release


def starting(run_id: int, committed: list):
    """A job of run ``run_id``'s worker: start the run (a fenced write), and note its commit."""
    def job():
        apply(Run.objects.get(pk=run_id).start, actor="worker")
        transaction.on_commit(lambda: committed.append(run_id))
        return run_id
    return job


def submit_leased(committer: GroupCommit, held: lease.Lease, job):
    with lease.kept(held):  # the job runs in a copy of this context: under this lease
        return committer.submit(job)


def test_a_run_whose_lease_was_taken_over_is_dropped_from_the_group_and_the_others_commit(committer, runs):
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    taken = runs[1]
    Run.objects.filter(pk=taken.pk).update(lease_token=leases[1].token + 1)  # another worker took it over
    events_before = Run.objects.get(pk=taken.pk).last_event_seq
    committed = []

    release = held_back(committer)
    futures = [submit_leased(committer, held, starting(run.pk, committed)) for run, held in zip(runs, leases)]
    release.set()

    assert futures[0].result(10) == runs[0].pk and futures[2].result(10) == runs[2].pk
    with pytest.raises(LeaseLost):
        futures[1].result(10)
    assert (committer.groups, committer.jobs) == (2, 4)  # the three in one transaction
    statuses = dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "status"))
    assert statuses == {runs[0].pk: RunStatus.RUNNING, taken.pk: RunStatus.QUEUED, runs[2].pk: RunStatus.RUNNING}
    assert Run.objects.get(pk=taken.pk).last_event_seq == events_before  # nothing of it was written
    assert sorted(committed) == sorted([runs[0].pk, runs[2].pk])  # its commit hooks never ran


def test_no_job_of_a_group_is_answered_before_the_group_commits(committer, runs):
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs[:2]]
    seen = {}
    release = held_back(committer)
    first = submit_leased(committer, leases[0], starting(runs[0].pk, []))

    def second():
        seen["first answered"] = first.done()
        return starting(runs[1].pk, [])()

    later = submit_leased(committer, leases[1], second)
    release.set()
    later.result(10)
    assert seen == {"first answered": False}
    assert first.result(10) == runs[0].pk


def test_a_job_going_on_after_a_database_error_fails_alone(committer, runs):
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed = []

    def swallowing():
        starting(runs[1].pk, committed)()
        try:
            with transaction.atomic(savepoint=False):
                raise IntegrityError("refused")
        except IntegrityError:
            pass  # went on as if nothing happened: its transaction is doomed
        return "done"

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], starting(runs[0].pk, committed)),
               submit_leased(committer, leases[1], swallowing),
               submit_leased(committer, leases[2], starting(runs[2].pk, committed))]
    release.set()

    with pytest.raises(TransactionManagementError):
        futures[1].result(10)
    assert [futures[0].result(10), futures[2].result(10)] == [runs[0].pk, runs[2].pk]
    assert Run.objects.get(pk=runs[1].pk).status == RunStatus.QUEUED
    assert sorted(committed) == sorted([runs[0].pk, runs[2].pk])


def test_a_broken_connection_fails_the_jobs_run_and_requeues_the_others(committer, runs):
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed = []

    def breaking():
        connection.connection.close()  # the database connection drops under the job
        Run.objects.count()

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], starting(runs[0].pk, committed)),
               submit_leased(committer, leases[1], breaking),
               submit_leased(committer, leases[2], starting(runs[2].pk, committed))]
    release.set()

    for future in futures[:2]:  # the first's writes went with the broken transaction
        with pytest.raises(Exception):
            future.result(10)
    assert futures[2].result(10) == runs[2].pk  # never run in the broken group: run in the next one
    statuses = dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "status"))
    assert statuses == {runs[0].pk: RunStatus.QUEUED, runs[1].pk: RunStatus.QUEUED, runs[2].pk: RunStatus.RUNNING}
    assert committed == [runs[2].pk]
