"""A group's first job, which runs in no savepoint of its own (runs.engine.group_commit), and policy scopes
locked by one upsert on PostgreSQL (tools.services.targets.lock_scopes): nested blocks, commit hooks, caught
errors, a dropped connection, key order and exclusion."""

import threading

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError

from runs import lease
from runs.models import Run, RunStatus
from tests.engine.test_group_commit import (  # noqa: F401 - fixtures
    _swallowing_a_read_error, committer, held_back, runs, starting, submit_leased)
from tests.support.sessions import in_session, wait_for_a_lock_wait
from tools.models import PolicyLock
from tools.services.targets import lock_scopes

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL")


def _statuses(runs):
    return dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "status"))


def _inputs(runs):
    return dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "input"))


def _set_input(run_id, text):
    Run.objects.filter(pk=run_id).update(input=text)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="an aborted transaction: PostgreSQL")
def test_a_first_job_that_swallows_a_read_error_fails_alone_and_the_others_commit(committer, runs):
    """Position 0 of test_a_job_that_swallows_a_read_error_fails_alone_wherever_it_is_in_its_group (pins it)."""
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed = []
    jobs = [_swallowing_a_read_error(runs[0].pk, committed)] + [starting(run.pk, committed) for run in runs[1:]]
    release = held_back(committer)
    futures = [submit_leased(committer, held, job) for held, job in zip(leases, jobs)]
    release.set()
    with pytest.raises(TransactionManagementError):
        futures[0].result(10)
    assert [f.result(10) for f in futures[1:]] == [runs[1].pk, runs[2].pk]
    assert _statuses(runs) == {runs[0].pk: RunStatus.QUEUED, runs[1].pk: RunStatus.RUNNING,
                               runs[2].pk: RunStatus.RUNNING}
    assert sorted(committed) == sorted([runs[1].pk, runs[2].pk])


def test_first_jobs_nested_blocks_and_hooks_then_a_failed_second_job_and_a_third(committer, runs):
    """The first job: a block that ends well (hook kept), a block caught failing (hook dropped), nested blocks
    inside nested blocks (inner kept, outer undone); the second job fails; the third commits."""
    hooks = []

    def first(run_id=runs[0].pk):
        with transaction.atomic():
            _set_input(run_id, "a")
            transaction.on_commit(lambda: hooks.append("first kept"))
        try:
            with transaction.atomic():
                _set_input(run_id, "undone")
                transaction.on_commit(lambda: hooks.append("first undone"))
                with transaction.atomic():
                    transaction.on_commit(lambda: hooks.append("first undone inner"))
                raise RuntimeError("caught")
        except RuntimeError:
            pass
        with transaction.atomic():
            with transaction.atomic():
                Run.objects.filter(pk=run_id).update(input=Run.objects.get(pk=run_id).input + "b")
                transaction.on_commit(lambda: hooks.append("first kept inner"))
        transaction.on_commit(lambda: hooks.append("first top"))
        return run_id

    def second(run_id=runs[1].pk):
        with transaction.atomic():
            _set_input(run_id, "lost")
            transaction.on_commit(lambda: hooks.append("second"))
        transaction.on_commit(lambda: hooks.append("second top"))
        raise RuntimeError("a bug")

    def third(run_id=runs[2].pk):
        with transaction.atomic():
            _set_input(run_id, "c")
            transaction.on_commit(lambda: hooks.append("third"))
        return run_id

    originals = {run.pk: run.input for run in runs}
    release = held_back(committer)
    futures = [committer.submit(job) for job in (first, second, third)]
    release.set()
    assert futures[0].result(10) == runs[0].pk
    with pytest.raises(RuntimeError):
        futures[1].result(10)
    assert futures[2].result(10) == runs[2].pk
    assert (committer.groups, committer.jobs) == (2, 4)
    assert _inputs(runs) == {runs[0].pk: "ab", runs[1].pk: originals[runs[1].pk], runs[2].pk: "c"}
    assert hooks == ["first kept", "first kept inner", "first top", "third"]


def test_a_first_job_that_catches_an_integrity_error_in_its_own_block_goes_on_and_commits(committer, runs):
    """Django's way of catching a database error (a block of its own around the failing write): the job goes
    on, its other writes and the other jobs commit."""
    def first(run_id=runs[0].pk):
        _set_input(run_id, "before")
        try:
            with transaction.atomic():
                PolicyLock.objects.create(key="dup")
                PolicyLock.objects.create(key="dup")
        except IntegrityError:
            pass
        with transaction.atomic():
            _set_input(run_id, Run.objects.get(pk=run_id).input + " after")
        return run_id

    def other(run_id):
        def job():
            _set_input(run_id, "other")
            return run_id
        return job

    release = held_back(committer)
    futures = [committer.submit(first), committer.submit(other(runs[1].pk)), committer.submit(other(runs[2].pk))]
    release.set()
    assert [f.result(10) for f in futures] == [run.pk for run in runs]
    assert (committer.groups, committer.jobs) == (2, 4)
    assert _inputs(runs) == {runs[0].pk: "before after", runs[1].pk: "other", runs[2].pk: "other"}
    assert not PolicyLock.objects.filter(key="dup").exists()


def test_a_first_job_using_the_savepoint_api_then_two_more(committer, runs):
    """``transaction.savepoint()`` / ``savepoint_rollback`` / ``savepoint_commit`` in the first job."""
    def first(run_id=runs[0].pk):
        sid = transaction.savepoint()
        _set_input(run_id, "undone")
        transaction.savepoint_rollback(sid)
        other = transaction.savepoint()
        _set_input(run_id, "kept")
        transaction.savepoint_commit(other)
        transaction.savepoint_commit(sid)
        return run_id

    def other(run_id):
        def job():
            with transaction.atomic():
                _set_input(run_id, "other")
            return run_id
        return job

    release = held_back(committer)
    futures = [committer.submit(first), committer.submit(other(runs[1].pk)), committer.submit(other(runs[2].pk))]
    release.set()
    assert [f.result(10) for f in futures] == [run.pk for run in runs]
    assert _inputs(runs) == {runs[0].pk: "kept", runs[1].pk: "other", runs[2].pk: "other"}


def test_a_first_job_that_closes_the_connection_fails_and_the_others_commit(committer, runs):
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed = []

    def closing():
        starting(runs[0].pk, committed)()
        connection.close()
        return "done"

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], closing),
               submit_leased(committer, leases[1], starting(runs[1].pk, committed)),
               submit_leased(committer, leases[2], starting(runs[2].pk, committed))]
    release.set()
    assert futures[0].exception(10) is not None
    assert [f.result(10) for f in futures[1:]] == [runs[1].pk, runs[2].pk]
    assert _statuses(runs) == {runs[0].pk: RunStatus.QUEUED, runs[1].pk: RunStatus.RUNNING,
                               runs[2].pk: RunStatus.RUNNING}
    assert sorted(committed) == sorted([runs[1].pk, runs[2].pk])


def test_a_first_job_that_takes_policy_locks_in_a_block_commits_alone(committer, runs):
    PolicyLock.objects.create(key="refund/run:old")
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed = []

    def locking():
        with transaction.atomic():
            lock_scopes({"refund/run:old", "refund/run:new"})
        return starting(runs[0].pk, committed)()

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], locking)] + [
        submit_leased(committer, held, starting(run.pk, committed)) for held, run in zip(leases[1:], runs[1:])]
    release.set()
    assert [f.result(10) for f in futures] == [run.pk for run in runs]
    assert (committer.groups, committer.jobs) == (3, 4)
    assert set(PolicyLock.objects.values_list("key", flat=True)) == {"refund/run:old", "refund/run:new"}
    assert sorted(committed) == sorted(run.pk for run in runs)


@postgresql_only
def test_lock_scopes_keeps_odd_keys_exactly():
    keys = {'t/target:"a,b"', "t/target:{x}", "t/target:NULL", "NULL", "t/ back\\slash", "t/ spaced ",
            "t/é ü", 't/"', ""}
    with transaction.atomic():
        lock_scopes(keys)
    assert set(PolicyLock.objects.values_list("key", flat=True)) == keys


@postgresql_only
@pytest.mark.parametrize("holder", ["select_for_update", "lock_scopes"])
@pytest.mark.parametrize("existing", [True, False], ids=["existing", "new"])
def test_lock_scopes_waits_for_a_session_holding_the_row(holder, existing):
    if existing:
        PolicyLock.objects.create(key="k")
    errors, holding, going, order = {}, threading.Event(), threading.Event(), []

    def hold():
        with transaction.atomic():
            if holder == "lock_scopes":
                lock_scopes({"k"})
            else:
                PolicyLock.objects.get_or_create(key="k")
                list(PolicyLock.objects.select_for_update().filter(key="k"))
            holding.set()
            going.wait(20)
            order.append("holder done")

    def lock():
        with transaction.atomic():
            lock_scopes({"j", "k"})
            order.append("locker locked")

    first = in_session(errors, "holder", hold)
    assert holding.wait(20)
    second = in_session(errors, "locker", lock)
    wait_for_a_lock_wait("")  # the locker waits (for the row, or for the holder's insert of it)
    going.set()
    first.join()
    second.join()
    assert errors == {}
    assert order == ["holder done", "locker locked"]


@postgresql_only
def test_two_lock_scopes_on_the_same_keys_never_deadlock():
    for key in ("k1", "k3"):
        PolicyLock.objects.create(key=key)
    errors, barrier = {}, threading.Barrier(8)

    def locker(n):
        def body():
            for _ in range(20):
                barrier.wait(20)
                with transaction.atomic():
                    lock_scopes({"k1", "k2", "k3", f"k{n}x"})
        return body

    threads = [in_session(errors, f"l{n}", locker(n)) for n in range(8)]
    for thread in threads:
        thread.join()
    assert errors == {}



@postgresql_only
def test_lock_scopes_outside_a_transaction_is_refused_as_before():
    """'Must be called inside a transaction': on PostgreSQL the SELECT ... FOR UPDATE refused to run in autocommit
    (Django's TransactionManagementError), so a caller that forgot its transaction learnt it; the upsert runs,
    commits at once, and the lock it took is gone before the caller does anything under it."""
    with pytest.raises(TransactionManagementError):
        lock_scopes({"refund/run:1"})
    assert not PolicyLock.objects.filter(key="refund/run:1").exists()


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="a dropped session: PostgreSQL")
def test_a_job_never_run_after_a_first_job_that_swallowed_a_dropped_connection_goes_back_to_the_queue(committer, runs):
    """Pre-existing (also before b3facc5): the first job's connection drops and it catches the error; the second
    job's savepoint cannot be made, so the second job, never run, is answered with that error instead of going
    back to the queue ('the jobs not yet run go back to the queue untouched')."""
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed, ran = [], []

    def swallowing():
        connection.connection.close()
        try:
            Run.objects.count()
        except DatabaseError:
            pass
        return "done"

    def counted():
        ran.append(runs[1].pk)
        return starting(runs[1].pk, committed)()

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], swallowing), submit_leased(committer, leases[1], counted),
               submit_leased(committer, leases[2], starting(runs[2].pk, committed))]
    release.set()
    assert futures[0].exception(10) is not None
    assert futures[1].result(10) == runs[1].pk
    assert futures[2].result(10) == runs[2].pk
    assert ran == [runs[1].pk]
