"""Group commit (runs.engine.group_commit): several runs' work in one transaction, each run's failure its own.

Each test holds the committer's only thread with a first job until the
jobs under test are queued, so those are taken together, as one group.

A group holds the row locks of all its runs until it commits, so the
writers that lock rows of several runs must never wait for one while
holding another (the last tests, on PostgreSQL: two sessions, each
holding what the other one wants next, in the order a group and that
writer would take them).
"""

import asyncio
import contextvars
import threading
from datetime import timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from approvals.models import Interrupt
from runs import lease
from runs.base.awaiting import resume, settle
from runs.engine import loop
from runs.engine.group_commit import GroupCommit
from runs.engine.lifecycle import start_run
from runs.lease import LeaseLost
from runs.models import Run, RunStatus, Step, WaitingReason
from runs.transitions import apply
from runs.tx import note_shared_lock
from tests.support.core import transfer
from tests.support.durability import lookup_agent, make_agent, paying_tool
from tests.support.sessions import group_writing, in_session, wait_for_a_lock_wait
from tools.models import PolicyLock, ToolCall, ToolCallStatus
from tools.registry import get_tool
from tools.services import execution
from tools.services.targets import claim, lock_scopes, release, target_of

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


def test_a_group_commit_is_at_rest_only_once_no_job_is_queued_or_running(committer):
    release = held_back(committer)
    queued = committer.submit(lambda: "done")
    assert not committer.wait_idle(0.2)
    release.set()
    assert committer.wait_idle(10) and queued.result(0) == "done"


def test_a_job_the_executor_refuses_is_not_left_counted():
    """Once its threads are shut down (as at the interpreter's exit) the executor refuses a drain: ``submit``
    raises, and ``wait_idle`` still finds the group commit at rest."""
    from concurrent.futures import ThreadPoolExecutor

    group_commit = GroupCommit(threads=1, max_group=8)
    threads, refusing = group_commit._executor, ThreadPoolExecutor(1)
    refusing.shutdown()
    group_commit._executor = refusing
    try:
        with pytest.raises(RuntimeError):
            group_commit.submit(lambda: "never run")
        assert group_commit.wait_idle(0)
    finally:
        group_commit._executor = threads


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


def test_a_policy_lock_the_submitter_noted_before_does_not_end_its_jobs_groups(committer, runs):
    # The submitting thread took a policy lock in a transaction of its own, long committed (e.g. a run
    # advanced in this thread): the jobs it submits afterwards are grouped as any others.
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed = []

    def submit_all():
        note_shared_lock()
        release = held_back(committer)
        futures = [submit_leased(committer, held, starting(run.pk, committed)) for run, held in zip(runs, leases)]
        release.set()
        return futures

    futures = contextvars.copy_context().run(submit_all)  # the note stays out of this test thread's context
    assert [future.result(10) for future in futures] == [run.pk for run in runs]
    assert (committer.groups, committer.jobs) == (2, 4)  # the three in one transaction


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


def test_each_jobs_savepoint_is_released_before_the_next_job_runs_and_a_failed_job_undoes_only_its_own(committer, runs):
    """The release goes with the next job's savepoint (one statement), so no job's savepoint nests in the one
    before it; the job after a failed one still commits, and so does the one before it."""
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed, seen = [], {}

    def failing():
        starting(runs[1].pk, committed)()
        raise RuntimeError("a bug")

    def looking():
        with connection.cursor() as cursor:  # this job's own savepoint (the group's third) is there
            cursor.execute(connection.ops.savepoint_rollback_sql("tollgate_job_3"))
        for before in ("tollgate_job_1", "tollgate_job_2"):  # the ones before it are gone: refused, in a savepoint
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(connection.ops.savepoint_commit_sql(before))
            except Exception as exc:  # noqa: BLE001 - which error the backend raises is what the test reads
                seen[before] = type(exc).__name__
        return starting(runs[2].pk, committed)()

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], starting(runs[0].pk, committed)),
               submit_leased(committer, leases[1], failing),
               submit_leased(committer, leases[2], looking)]
    release.set()

    assert futures[0].result(10) == runs[0].pk
    with pytest.raises(RuntimeError):
        futures[1].result(10)
    assert futures[2].result(10) == runs[2].pk
    assert seen == {"tollgate_job_1": "OperationalError", "tollgate_job_2": "OperationalError"}
    statuses = dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "status"))
    assert statuses == {runs[0].pk: RunStatus.RUNNING, runs[1].pk: RunStatus.QUEUED, runs[2].pk: RunStatus.RUNNING}
    assert sorted(committed) == sorted([runs[0].pk, runs[2].pk])


def test_a_failed_first_job_undoes_only_its_own_and_the_others_commit_in_the_next_group(committer, runs):
    """The group's first job runs in no savepoint of its own: its failure rolls the transaction back, and the
    jobs not yet run go back to the queue untouched, each run once."""
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed, ran = [], []

    def failing():
        starting(runs[0].pk, committed)()
        raise RuntimeError("a bug")

    def counted(run_id):
        def job():
            ran.append(run_id)
            return starting(run_id, committed)()
        return job

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], failing),
               submit_leased(committer, leases[1], counted(runs[1].pk)),
               submit_leased(committer, leases[2], counted(runs[2].pk))]
    release.set()

    with pytest.raises(RuntimeError):
        futures[0].result(10)
    assert [futures[1].result(10), futures[2].result(10)] == [runs[1].pk, runs[2].pk]
    assert ran == [runs[1].pk, runs[2].pk]  # once each, after the failed group
    assert (committer.groups, committer.jobs) == (3, 4)  # held back; the failed first job alone; the two others
    statuses = dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "status"))
    assert statuses == {runs[0].pk: RunStatus.QUEUED, runs[1].pk: RunStatus.RUNNING, runs[2].pk: RunStatus.RUNNING}
    assert sorted(committed) == sorted([runs[1].pk, runs[2].pk])


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="nested savepoints released by their parent: PostgreSQL")
def test_the_first_jobs_nested_savepoints_are_released_before_the_second_jobs_savepoint(committer, runs):
    """The first job has no savepoint to take its nested blocks' with it: the second job's statement releases
    the oldest left open (one rolled back to inside its enclosing block is gone, and not released again)."""
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs[:2]]
    names, seen = {}, {}

    def nesting():
        with transaction.atomic():
            names["kept"] = connection.savepoint_ids[-1]
            try:
                with transaction.atomic():
                    names["undone"] = connection.savepoint_ids[-1]
                    with transaction.atomic():
                        names["undone inner"] = connection.savepoint_ids[-1]
                    raise RuntimeError("caught by the job")
            except RuntimeError:
                pass
        return starting(runs[0].pk, [])()

    def looking():
        for name, sid in names.items():  # each is gone: released with the first job's oldest, before this savepoint
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(connection.ops.savepoint_commit_sql(sid))
            except Exception as exc:  # noqa: BLE001 - which error the backend raises is what the test reads
                seen[name] = type(exc).__name__
        return starting(runs[1].pk, [])()

    release = held_back(committer)
    futures = [submit_leased(committer, leases[0], nesting), submit_leased(committer, leases[1], looking)]
    release.set()

    assert [future.result(10) for future in futures] == [runs[0].pk, runs[1].pk]
    assert seen == {name: "OperationalError" for name in ("kept", "undone", "undone inner")}
    assert (committer.groups, committer.jobs) == (2, 3)
    statuses = dict(Run.objects.filter(pk__in=[run.pk for run in runs[:2]]).values_list("pk", "status"))
    assert statuses == {runs[0].pk: RunStatus.RUNNING, runs[1].pk: RunStatus.RUNNING}


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


def test_a_database_thread_keeps_its_connection_from_one_group_to_the_next(committer, runs):
    """Its statements stay prepared there (with PostgreSQL's pool a connection handed back after each job would
    come back as whichever connection was used least recently)."""
    def opened():
        Run.objects.count()
        return id(connection.connection)

    def still_open():
        return None if connection.connection is None else id(connection.connection)

    first = committer.submit(opened).result(10)
    assert committer.submit(still_open).result(10) == first


def _backend_pid():
    Run.objects.count()
    return connection.connection.info.backend_pid


def _in_a_transaction():
    with transaction.atomic():
        return Run.objects.count()


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="a server that ends a session: PostgreSQL")
@pytest.mark.parametrize("first", [Run.objects.count, _in_a_transaction], ids=["autocommit", "transaction"])
def test_after_the_server_ended_a_database_threads_session_its_next_jobs_connect_afresh(committer, first):
    """A restart or a failover (reviewer): the kept connection is dropped by the first job that meets the ended
    session, whether that job raised or caught the error; every job after it works."""
    backend = committer.submit(_backend_pid).result(10)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
    committer.submit(first).exception(10)  # meets the ended session (or a fresh one)
    assert [committer.submit(_in_a_transaction).result(10) for _ in range(2)] == [0, 0]
    assert committer.submit(Run.objects.count).result(10) == 0


def test_a_job_that_takes_a_policy_lock_ends_its_group_and_the_jobs_after_it_commit_in_the_next(committer, runs):
    """A policy lock (a tool target's or a rule scope's row) is committed with the job that took it, before
    any other job runs: a later job of the group could otherwise wait for another group that waits for it."""
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    seen = {}

    def locking():
        lock_scopes({f"refund/run:{runs[0].pk}"})
        return starting(runs[0].pk, [])()

    release = held_back(committer)
    first = submit_leased(committer, leases[0], locking)

    def second():
        seen["first answered"] = first.done()
        return starting(runs[1].pk, [])()

    futures = [first, submit_leased(committer, leases[1], second),
               submit_leased(committer, leases[2], starting(runs[2].pk, []))]
    release.set()

    assert [future.result(10) for future in futures] == [run.pk for run in runs]
    assert seen == {"first answered": True}
    assert (committer.groups, committer.jobs) == (3, 4)  # held back; the locking job; the two others together


postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="row locks held across sessions: PostgreSQL (SQLite serializes writers)")


def transfers_to_one_account(people, worker, count: int) -> list[ToolCall]:
    """``count`` runs' transfer calls to acme, each ``ready``, never sent; their runs wait ``retry_backoff``."""
    agent = make_agent("transfer-acme", [{"tool_calls": [transfer("acme", 8)]}, {"content": "Done."}],
                       tools=["fake_transfer"], check="fake_transfer")
    runs = [start_run(agent=agent, user=people["requester"], input=f"send 8 to acme, {n}") for n in range(count)]
    worker.drain()
    Interrupt.objects.filter(run__in=runs).update(status="resolved")  # decided, as far as this test cares
    ToolCall.objects.filter(run__in=runs).update(status=ToolCallStatus.READY, attempts=0)
    Run.objects.filter(pk__in=[run.pk for run in runs]).update(
        status=RunStatus.WAITING, waiting_reason=WaitingReason.RETRY_BACKOFF,
        wake_at=timezone.now() + timedelta(minutes=1))
    return [ToolCall.objects.get(run=run) for run in runs]


@postgresql_only
def test_a_release_does_not_wait_for_a_waiters_row_that_a_group_claiming_the_target_holds(people, worker):
    """The cycle: a release locks the target's row, then the rows of the runs waiting for it; another group
    holds a waiter's row (its job woke the run) and its next job claims the target. The release skips the
    row instead of waiting (which PostgreSQL would break by failing one of them), and wakes that waiter
    once both have committed."""
    holder, waiter = transfers_to_one_account(people, worker, 2)
    tool = get_tool("fake_transfer")
    target = target_of(tool, holder.arguments)
    with transaction.atomic():
        assert claim(target, holder) is None
    with transaction.atomic():
        assert claim(target, waiter) == holder.pk  # found held: the engine parks its run, as it is here
    errors, claimed, go = {}, {}, threading.Event()
    holds_the_row = threading.Event()

    def other_group():
        with transaction.atomic():
            Run.objects.select_for_update().get(pk=waiter.run_id)
            holds_the_row.set()
            go.wait(20)
            claimed["holder"] = claim(target, waiter)  # waits for the release's lock on the target's row

    group = in_session(errors, "other group", other_group)
    try:
        assert holds_the_row.wait(20)
        with transaction.atomic():
            ToolCall.objects.filter(pk=holder.pk).update(status=ToolCallStatus.SUCCEEDED)  # the holder's outcome
            PolicyLock.objects.select_for_update().get(key=target.lock_key)  # the release's first lock, taken early
            go.set()
            wait_for_a_lock_wait("INSERT INTO")  # the other group's claim waits for the target's row
            woken_at_once = release(holder, tool, actor="test")
    finally:
        go.set()
        group.join()
    assert errors == {}  # no deadlock for PostgreSQL to break
    assert woken_at_once == 0  # its waiter's row was busy: skipped, not waited for
    assert claimed == {"holder": None}  # the claim went through once the release committed
    woken = Run.objects.get(pk=waiter.run_id)  # after both commits, in a transaction of its own
    assert woken.status != RunStatus.WAITING
    assert woken.events.filter(reason=f"call #{holder.pk} released {target.label}").exists()


@postgresql_only
def test_the_lease_keeper_does_not_wait_for_a_row_that_a_group_holds_while_holding_another(runs):
    """The cycle: a group holds a later run's row and its next job writes an earlier run's; the keeper's
    renewal locks the earlier row, then waits for the later one. It skips the busy row and renews it on
    its own, holding nothing else, so the group goes on and every lease is renewed."""
    first, second = runs[:2]
    leases = [lease.acquire(run.pk, owner="worker-a") for run in (first, second)]
    before = dict(Run.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "lease_expires_at"))
    errors, renewed = {}, []
    with group_writing(errors, later=second.pk, earlier=first.pk) as go:
        keeper = in_session(errors, "keeper", lambda: renewed.append(lease.renew_all(leases)))
        wait_for_a_lock_wait("UPDATE")  # the keeper waits for the later run's row
        go()
        keeper.join()
    assert errors == {} and renewed == [2]
    after = dict(Run.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "lease_expires_at"))
    assert all(after[pk] > before[pk] for pk in before)


def _swallowing_a_read_error(run_id: int, committed: list):
    """A job that starts its run, then catches a database error of a plain read (no ``atomic`` around it: Django
    does not mark the transaction for rollback, yet PostgreSQL has aborted it) and goes on."""
    def job():
        starting(run_id, committed)()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 / 0")
        except DatabaseError:
            pass
        return "done"
    return job


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="an aborted transaction: PostgreSQL")
@pytest.mark.parametrize("position", [1, 2], ids=["middle", "last"])
def test_a_job_that_swallows_a_read_error_fails_alone_wherever_it_is_in_its_group(committer, runs, position):
    """PostgreSQL aborted the transaction under the job (it caught the error and went on): the job is rolled
    back to its savepoint and fails alone, in the middle of its group (the next job's savepoint is not made in
    an aborted transaction) or last (the COMMIT would silently roll the whole group back)."""
    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed = []
    jobs = [starting(run.pk, committed) for run in runs]
    jobs[position] = _swallowing_a_read_error(runs[position].pk, committed)

    release = held_back(committer)
    futures = [submit_leased(committer, held, job) for held, job in zip(leases, jobs)]
    release.set()

    outcomes = []
    for future in futures:
        exc = future.exception(10)
        outcomes.append(type(exc).__name__ if exc else "ok")
    statuses = dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "status"))
    stored = [statuses[run.pk] == RunStatus.RUNNING for run in runs]
    expected_ok = [n != position for n in range(3)]
    assert [o == "ok" for o in outcomes] == expected_ok, (outcomes, stored)
    assert stored == expected_ok, (outcomes, stored)


def test_the_statements_that_release_and_make_savepoints_recur_group_after_group_without_harm(committer, people):
    """The same ``RELEASE SAVEPOINT ...; SAVEPOINT ...`` text on one connection, group after group, past the
    driver's threshold for preparing a statement (PostgreSQL prepares one statement only: it must not try)."""
    agent = lookup_agent()
    for group in range(8):
        runs_of_group = [start_run(agent=agent, user=people["requester"], input=f"{group}-{n}") for n in range(3)]
        leases = [lease.acquire(run.pk, owner="worker-a") for run in runs_of_group]
        committed = []
        release = held_back(committer)
        futures = [submit_leased(committer, held, starting(run.pk, committed))
                   for held, run in zip(leases, runs_of_group)]
        release.set()
        assert [future.result(10) for future in futures] == [run.pk for run in runs_of_group]
        assert sorted(committed) == sorted(run.pk for run in runs_of_group)


@pytest.mark.parametrize("max_group", [1, 8])
def test_a_lone_jobs_transactions_commit_as_it_makes_them_and_a_later_failure_keeps_them(runs, max_group):
    """Alone (groups on or off), a job is run as outside the engine: what it committed before it failed (a side
    effect's outcome, say, before the next call's claim hit a deadlock) stays committed."""
    committer = GroupCommit(threads=1, max_group=max_group)
    held = lease.acquire(runs[0].pk, owner="worker-a")
    committed = []

    def started_then_a_failure():
        starting(runs[0].pk, committed)()
        raise RuntimeError("a bug after it")

    try:
        error = submit_leased(committer, held, started_then_a_failure).exception(10)
    finally:
        committer.close_connections()
    assert isinstance(error, RuntimeError)
    assert Run.objects.get(pk=runs[0].pk).status == RunStatus.RUNNING
    assert committed == [runs[0].pk]


def _in_groups(committer: GroupCommit, held: lease.Lease, steps):
    """Drive the step generator ``steps`` as the engine does, each stretch of it a job of ``committer``, but
    always in a group of two (a job of nothing queued before it): each stretch in a savepoint of its own,
    committed with the group. Returns what the generator returns; raises what a stretch raised."""
    answer = None
    while True:
        release = held_back(committer)
        submit_leased(committer, held, lambda: None)
        stretch = submit_leased(committer, held, lambda answer=answer: resume(steps, answer))
        release.set()
        done, value = stretch.result(20)
        if done:
            return value
        answer = asyncio.run(settle(value))


def test_a_side_effects_outcome_is_committed_before_the_next_pass_so_a_later_failure_in_its_group_keeps_it(
        committer, people, monkeypatch):
    """A payment (a side effect) is made and its outcome stored; the job goes on to the next pass, the next model
    turn, which fails (a bug, a broken statement). Its group rolls the job back to its savepoint: were the
    outcome in the same job, an effect that happened would be undone with it, and the takeover could only call
    the call unknown."""
    sent = []
    tool = paying_tool(monkeypatch, sent, target_key="")
    agent = make_agent("group-pay", [{"tool_calls": [{"name": tool.name, "arguments": {"account": "a"}}]},
                                     {"content": "Paid."}], tools=[tool.name])
    run = start_run(agent=agent, user=people["requester"], input="pay a")
    asking = loop._model_request

    def failing_second_turn(run, history):
        if run.model_calls:
            raise RuntimeError("the next turn failed")
        return asking(run, history)

    monkeypatch.setattr(loop, "_model_request", failing_second_turn)
    held = lease.acquire(run.pk, owner="worker-a")
    with pytest.raises(RuntimeError, match="the next turn failed"):
        _in_groups(committer, held, loop.advance_slice(run.pk))

    assert sent == ["a"]
    paid = ToolCall.objects.get(run=run)
    assert (paid.status, paid.result) == (ToolCallStatus.SUCCEEDED, {"paid": "a", "payment_id": "pay-1"})


def test_a_model_answer_is_committed_before_the_next_pass_so_a_failed_claim_of_its_first_call_keeps_it(
        committer, people, monkeypatch):
    """The model answers with a side effect on a target. The job that stores the answer (its step, usage and
    proposed call) goes on, with no call in between, to the call's claim of its target. If that claim fails (a
    deadlock, say; here a failure made on purpose), the job's savepoint is rolled back, and with it an answer
    the model gave and was paid for: the step is left ``started`` (a takeover discards it and counts a death),
    the run's usage leaves that call's tokens out, and the model is asked again."""
    tool = paying_tool(monkeypatch, [])
    agent = make_agent("group-pay-one", [
        {"tool_calls": [{"name": tool.name, "arguments": {"account": "a"}}]},
        {"content": "Paid."}], tools=[tool.name])
    run = start_run(agent=agent, user=people["requester"], input="pay a")

    def failing_claim(target, call):
        raise RuntimeError("the claim of a failed (a deadlock, say)")

    monkeypatch.setattr(execution, "claim_if_free", failing_claim)
    held = lease.acquire(run.pk, owner="worker-a")
    with pytest.raises(RuntimeError, match="the claim of a failed"):
        _in_groups(committer, held, loop.advance_slice(run.pk))

    step = Step.objects.get(run=run, index=0)
    assert step.status == Step.Status.SUCCEEDED
    assert ToolCall.objects.filter(run=run, name=tool.name).count() == 1
    assert Run.objects.get(pk=run.pk).model_calls == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="runs.base.postgresql, PostgreSQL's backend")
def test_a_jobs_nested_blocks_are_released_with_its_savepoint_and_still_roll_back_on_their_own(committer, runs):
    """Inside a job, a nested ``atomic`` that ends well sends no RELEASE (the job's own release takes its savepoint
    along); one that fails after it still undoes only its own writes, and a job that fails undoes its blocks too."""
    sent: dict[int, list[str]] = {}

    def recorded(run_id, work):
        def job():
            statements = sent.setdefault(run_id, [])
            with connection.execute_wrapper(lambda execute, sql, *rest: statements.append(sql) or execute(sql, *rest)):
                return work(run_id)
        return job

    def set_input(run_id, text):
        Run.objects.filter(pk=run_id).update(input=text)

    def kept_then_undone(run_id):
        with transaction.atomic():
            set_input(run_id, "kept")
        try:
            with transaction.atomic():
                set_input(run_id, "undone")
                raise IntegrityError("refused")
        except IntegrityError:
            pass
        with transaction.atomic():  # a block after the failed one, nested in nothing the failure took
            Run.objects.filter(pk=run_id).update(input=Run.objects.get(pk=run_id).input + " and kept")
        return run_id

    def failing_after_a_block(run_id):
        with transaction.atomic():
            set_input(run_id, "lost with its job")
        raise RuntimeError("a bug")

    def one_block(run_id):
        with transaction.atomic():
            set_input(run_id, "alone")
        return run_id

    originals = {run.pk: run.input for run in runs}
    release = held_back(committer)
    futures = [committer.submit(recorded(run.pk, work))
               for run, work in zip(runs, (kept_then_undone, failing_after_a_block, one_block))]
    release.set()

    assert futures[0].result(10) == runs[0].pk
    with pytest.raises(RuntimeError):
        futures[1].result(10)
    assert futures[2].result(10) == runs[2].pk
    inputs = dict(Run.objects.filter(pk__in=originals).values_list("pk", "input"))
    assert inputs == {runs[0].pk: "kept and kept", runs[1].pk: originals[runs[1].pk], runs[2].pk: "alone"}
    everything = [sql for statements in sent.values() for sql in statements]
    assert sum(sql.startswith("SAVEPOINT") for sql in everything) == 5
    assert not [sql for sql in everything if sql.startswith("RELEASE")], "each block goes with its job's savepoint"
    assert sum(sql.startswith("ROLLBACK TO SAVEPOINT") for sql in everything) == 1

    with transaction.atomic():  # outside a job, a nested block is released at its end, as Django does it
        statements = []
        with connection.execute_wrapper(lambda execute, sql, *rest: statements.append(sql) or execute(sql, *rest)):
            with transaction.atomic():
                set_input(runs[2].pk, "alone again")
    assert [sql.split()[0] for sql in statements] == ["SAVEPOINT", "UPDATE", "RELEASE"]


def test_a_job_whose_savepoint_cannot_be_made_goes_back_to_the_queue_unrun(committer, runs, monkeypatch):
    """The transaction is unusable before the job ran: the jobs already run get the error, it and the ones after
    it run in the next group, once each."""
    from runs.engine import group_commit

    leases = [lease.acquire(run.pk, owner="worker-a") for run in runs]
    committed, ran, failed = [], [], []
    make = group_commit._JobSavepoints._make

    def failing_once(self):
        if self._made == 1 and not failed:  # making the group's second job's savepoint
            failed.append(True)
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM no_such_table")  # the transaction is aborted as a broken one would be
        return make(self)

    def counted(run_id):
        def job():
            ran.append(run_id)
            return starting(run_id, committed)()
        return job

    monkeypatch.setattr(group_commit._JobSavepoints, "_make", failing_once)
    release = held_back(committer)
    futures = [submit_leased(committer, held, counted(run.pk)) for run, held in zip(runs, leases)]
    release.set()

    with pytest.raises(DatabaseError):
        futures[0].result(10)  # its writes went with the unusable transaction
    assert [futures[1].result(10), futures[2].result(10)] == [runs[1].pk, runs[2].pk]
    assert ran == [run.pk for run in runs]  # each once: the second and third in the next group
    statuses = dict(Run.objects.filter(pk__in=[run.pk for run in runs]).values_list("pk", "status"))
    assert statuses == {runs[0].pk: RunStatus.QUEUED, runs[1].pk: RunStatus.RUNNING, runs[2].pk: RunStatus.RUNNING}
    assert sorted(committed) == sorted([runs[1].pk, runs[2].pk])
