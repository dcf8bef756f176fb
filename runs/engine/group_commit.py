"""Group commit: the database work of several runs' steps, committed in one transaction.

The engine (``runs.engine.runtime``) runs each run's database work
between two calls as one *job* (a function of that run, e.g. resuming its
step generator). When jobs are ready faster than the database threads can
commit them one by one, a thread takes up to ``ENGINE_GROUP_MAX`` of them
and runs them in one database transaction, each job after the first in a
savepoint of its own (``_JobSavepoints``: released by the statement that
makes the next), then commits once:

* **One run's failure is its own.** A job that raises (its fenced write
  found the lease taken over: ``LeaseLost``; a transition refused; a bug)
  is rolled back to its savepoint, so nothing it wrote is committed; the
  others commit. The first job needs no savepoint: when it fails, the
  transaction is rolled back (it holds nothing else yet) and the jobs not
  yet run go back to the queue untouched, as after a broken transaction.
* **Durable before anything goes on.** No job's result is handed back
  before the group's COMMIT: a step's next call (a model call, a side
  effect whose idempotency key the job stored) starts only once its writes
  are durable. If the COMMIT fails, every job of the group gets the error,
  as a lone transaction's caller would.
* **A lone job commits at once.** A thread never waits for company: it
  takes what is queued when it is free, so when the system is not
  saturated a group is one job, run as outside the engine (its own
  transactions commit as it makes them), and latency is as before.
* **A broken transaction ends the group early.** When a job leaves the
  transaction unusable (its savepoint could not be rolled back, or the
  connection broke), the jobs already run get that error and the jobs not
  yet run go back to the queue untouched, the one whose savepoint could not
  be made among them.
* **So does a policy lock.** A job that took a lock other runs' jobs take
  too (a target's claim or release, a rule's scopes:
  ``runs.tx.note_shared_lock``) is the group's last: the group commits and
  the jobs not yet run go back to the queue, so a group holds such locks
  only from its last job.

What commits together is only ever a batch of complete, independent run
transactions; ``transaction.on_commit`` hooks (wake-ups, live pushes) run
after the group's COMMIT, a failed job's hooks never. A group holds the
rows its jobs locked until it commits, taken in job order; so that groups
never wait on each other in a circle, nothing waits for a row while
holding rows of other runs (``runs.tx``'s lock order: a target's release
and the lease keeper skip busy rows), and policy locks come last. Groups
are on by default (``ENGINE_GROUP_MAX`` 8); docs/design.md ("Group commit")
says what is left to PostgreSQL's deadlock detection (it fails one job,
whose run is retried: ``runtime.settle_failure``).

The idea is the database's own group commit (PostgreSQL's ``commit_delay``,
"Group Commit for the Write-Ahead Log"), applied to whole transactions in
the application, where one COMMIT (one WAL flush, one round trip) then
serves many runs.
"""

import collections
import contextlib
import contextvars
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from django.db import connection, transaction
from django.db.transaction import TransactionManagementError

from runs.base.awaiting import close_pool_connections, holding_connection
from runs.tx import clear_shared_lock, holds_shared_lock


@dataclass
class _Job:
    context: contextvars.Context
    fn: Callable
    args: tuple
    future: Future


class GroupCommit:
    """Jobs run on ``threads`` database threads, up to ``max_group`` of them per transaction.

    ``submit(fn, *args)`` returns a ``concurrent.futures.Future`` of
    ``fn(*args)``'s result (or its exception), set once the transaction it
    ran in committed (or failed). ``fn`` runs in a copy of the submitter's
    context (``contextvars``: the run's lease) and must do only database
    work (it holds the group's transaction while it runs). ``wait_idle``
    waits until no job is queued or running.
    """

    def __init__(self, *, threads: int, max_group: int):
        self._threads = threads
        self._max_group = max(1, max_group)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="tollgate-db")
        self._jobs: collections.deque[_Job] = collections.deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when the last drain queued or running ends
        self._drains = 0  # drains (``_drain``) queued or running
        self.groups = 0  # transactions committed or failed since start
        self.jobs = 0  # jobs run in them

    def submit(self, fn: Callable, *args) -> Future:
        """Queue ``fn(*args)``; a free database thread runs it with whatever else is queued by then."""
        future = Future()
        context = contextvars.copy_context()
        context.run(clear_shared_lock)  # a lock the submitter noted in a transaction of its own is not the job's
        with self._lock:  # counted before the job is queued: ``wait_idle`` never sees a job with no drain for it
            self._drains += 1
        self._jobs.append(_Job(context, fn, args, future))
        self._queue_drains(1)
        return future

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no job is queued or running (at most ``timeout_s`` seconds); True if none is.

        Every job is queued with a drain of its own, counted before the job is queued and until it has
        run (a job put back in the queue gets a new one before its drain ends), so no drain queued or
        running means no job either: the database threads are done with the database until the next
        ``submit`` (each still keeps its connection: ``close_connections``).
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._drains == 0, timeout=timeout_s)

    def close_connections(self) -> None:
        """Close the database connection of every database thread (call it only while no job is queued:
        ``wait_idle``)."""
        close_pool_connections(self._executor, self._threads)

    def _drain(self) -> None:
        """Run what is queued now (at most ``max_group`` jobs) as one group; nothing queued: nothing to do
        (each submit queues one drain, and an earlier drain may have taken its job)."""
        try:
            group = []
            while len(group) < self._max_group:
                try:
                    group.append(self._jobs.popleft())
                except IndexError:
                    break
            if group:
                holding_connection(self._commit, group)  # a database thread keeps its connection between groups
        finally:
            self._drained(1)

    def _commit(self, group: list[_Job]) -> None:
        if len(group) == 1:  # alone: its own transactions commit as it makes them, as outside the engine
            _run_alone(group[0])
            with self._lock:
                self.groups += 1
                self.jobs += 1
            return
        outcomes: list[tuple[bool, Any]] = []
        ran = group  # the jobs the transaction runs: all of them unless it stops early
        try:
            try:
                with transaction.atomic():
                    savepoints = _JobSavepoints()
                    for job in group:
                        try:
                            outcomes.append(savepoints.run(job))
                        except _Broken:  # its savepoint could not be made: it never ran, and goes back to the queue
                            ran = group[:len(outcomes)]
                            raise
                        if connection.needs_rollback:  # the transaction is unusable: stop here
                            ran = group[:len(outcomes)]
                            raise _Broken(outcomes[-1][1])
                        if holds_shared_lock(job.context):  # committed before another job may wait for it
                            ran = group[:len(outcomes)]
                            break
            except _Broken as broken:
                outcomes = [(False, broken.error)] * len(ran)
            except Exception as exc:  # the COMMIT failed: nothing of the group is stored
                outcomes = [(False, exc)] * len(ran)
            self._requeue(group[len(ran):])
            group = ran
        finally:
            with self._lock:
                self.groups += 1
                self.jobs += len(group)
            for job, (ok, value) in zip(group, outcomes):
                job.future.set_result(value) if ok else job.future.set_exception(value)
            for job in group[len(outcomes):]:  # something outside Exception (e.g. SystemExit) stopped the group
                job.future.set_exception(RuntimeError("the database thread stopped"))

    def _requeue(self, jobs: list[_Job]) -> None:
        """Queue ``jobs`` (never run) again, ahead of the others."""
        with self._lock:  # counted while the drain that puts them back still runs (``wait_idle``)
            self._drains += len(jobs)
        for job in reversed(jobs):
            self._jobs.appendleft(job)
        self._queue_drains(len(jobs))

    def _queue_drains(self, count: int) -> None:
        """Hand ``count`` drains, already counted, to the executor; those it refuses (``RuntimeError`` once the
        interpreter shuts down) are counted off again before the error is raised, so ``wait_idle`` still ends."""
        for queued in range(count):
            try:
                self._executor.submit(self._drain)
            except BaseException:
                self._drained(count - queued)
                raise

    def _drained(self, count: int) -> None:
        with self._idle:
            self._drains -= count
            if self._drains == 0:
                self._idle.notify_all()


class _Broken(Exception):
    def __init__(self, error: BaseException):
        self.error = error


def _run_alone(job: _Job) -> None:
    try:
        result = job.context.run(job.fn, *job.args)
    except BaseException as exc:
        job.future.set_exception(exc if isinstance(exc, Exception) else RuntimeError("the database thread stopped"))
        if not isinstance(exc, Exception):
            raise
    else:
        job.future.set_result(result)


def _nested_released_with(connection):
    """``connection.releasing_nested_by_parent()`` where the backend has it (``runs.base.postgresql``), else
    nothing changes."""
    releasing = getattr(connection, "releasing_nested_by_parent", None)
    return releasing() if releasing is not None else contextlib.nullcontext()


def _aborted() -> bool:
    """Whether PostgreSQL aborted the connection's transaction, or the connection is gone with it (a statement
    failed in it, or the session dropped, and a job caught the error outside any ``atomic``, which Django does
    not mark for rollback): read from the driver, no round trip."""
    raw = connection.connection
    if raw is None or connection.vendor != "postgresql":
        return False
    from psycopg.pq import TransactionStatus

    return raw.info.transaction_status in (TransactionStatus.INERROR, TransactionStatus.UNKNOWN)


class _JobSavepoints:
    """The savepoints of one group's jobs, each released by the statement that creates the next.

    A job runs in a savepoint of its own, so that its failure undoes only its
    writes; the group's first needs none (its failure rolls the transaction
    back, the group's other jobs not run yet), which saves a statement per
    group. Releasing a savepoint costs a round trip of its own when done apart; here
    ``RELEASE SAVEPOINT`` of job *n* goes in the same statement as the
    ``SAVEPOINT`` of job *n + 1* (PostgreSQL runs several utility statements
    sent as one simple query), and the last job's savepoint is released by the
    group's COMMIT. Each job's savepoint is still released before the next
    job's is made, so no job's nests in another's (a write in nested open
    savepoints takes a subtransaction id for each: ``docs/design.md``, "Group
    commit"); a job's own nested blocks nest in it, and in each other (below). Elsewhere
    (SQLite) the two statements go one after the other.

    Django's bookkeeping is kept as ``transaction.atomic`` keeps it: the job's
    savepoint is on ``connection.savepoint_ids`` while it runs, so the commit
    hooks it registers are dropped if it is rolled back
    (``savepoint_rollback``), and its own ``atomic`` blocks nest inside it.
    Those blocks' savepoints are released with the job's own, not one round
    trip each (``runs.base.postgresql``: on PostgreSQL, releasing a savepoint
    releases those made after it), so a job's later blocks nest in its
    earlier ones until then. The first job's, having no job savepoint to go
    with, are released by the second job's statement: the oldest of them
    left open (``left_open`` of ``runs.base.postgresql``) takes the later
    ones with it.
    """

    def __init__(self):
        self._open: str | None = None  # the last job's savepoint, not released yet
        self._nested: list[str] = []  # the first job's oldest nested savepoint left open, if any
        self._made = 0

    def run(self, job: _Job) -> tuple[bool, Any]:
        """``(True, result)`` of the job, or ``(False, its exception)`` with its writes rolled back. When the
        transaction became unusable (the savepoint could not be made or rolled back, or the group's first job
        failed: it runs in no savepoint, its rollback is the transaction's), ``connection.needs_rollback`` is set
        on return, as ``atomic`` leaves it. Raises ``_Broken`` when the job's savepoint could not be made (the job
        did not run)."""
        try:
            sid = self._make()
        except Exception as exc:
            connection.needs_rollback = True
            raise _Broken(exc) from exc
        if sid is not None:
            connection.savepoint_ids.append(sid)
        try:
            with _nested_released_with(connection):
                result = job.context.run(job.fn, *job.args)
            if connection.needs_rollback or _aborted():  # it caught a database error and went on: its writes are void
                raise TransactionManagementError("a job went on after a database error in its transaction")
            if sid is None:  # the first job: the oldest nested savepoint it left open, for the second job to release
                self._nested = getattr(connection, "left_open", [])[:1]
            return True, result
        except Exception as exc:
            if sid is None:  # the first job: undone with the transaction, which commits nothing then
                connection.needs_rollback = True
                return False, exc
            connection.needs_rollback = False
            try:
                connection.savepoint_rollback(sid)  # and its commit hooks dropped
            except Exception:
                connection.needs_rollback = True
            return False, exc
        finally:
            if sid in connection.savepoint_ids:  # gone if the job closed the connection under the transaction
                connection.savepoint_ids.remove(sid)

    def _make(self) -> str | None:
        """Create the next job's savepoint, releasing what is left open before it in the same statement; its
        name. None for the group's first job, which needs none (nothing of another job is there to keep)."""
        self._made += 1
        if self._made == 1:
            return None
        sid = f"tollgate_job_{self._made}"
        ops = connection.ops
        # The job before's savepoint, or the first job's oldest nested one left open (which takes the later
        # ones with it); none when the first job left none open.
        previous, self._open, self._nested = self._open or (self._nested[0] if self._nested else None), None, []
        if previous is not None and connection.vendor == "postgresql":
            # Two statements in one simple query (no parameters); psycopg never prepares a query that
            # answered with more than one result.
            with connection.cursor() as cursor:
                cursor.execute(f"{ops.savepoint_commit_sql(previous)}; {ops.savepoint_create_sql(sid)}")
        else:
            with connection.cursor() as cursor:
                if previous is not None:
                    cursor.execute(ops.savepoint_commit_sql(previous))
                cursor.execute(ops.savepoint_create_sql(sid))
        self._open = sid
        return sid
