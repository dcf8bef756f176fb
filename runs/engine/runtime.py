"""The engine of one worker process: many runs in flight on one event loop, their database work on a few threads.

A Dramatiq message (``runs.engine.actors.advance_run``) hands its run
here (``submit``: in the broker's worker thread, the run's lease is taken
and the slice's first database work done, up to its first call), then
returns: that thread is free for the next message. Each run in flight is
then an asyncio task that drives the rest of the loop's slice
(``runs.engine.loop.advance_slice``, a step generator, ``runs.base.awaiting``):

* the database work between two calls runs on one of
  ``TOLLGATE["ENGINE_DB_THREADS"]`` threads, so a process opens that many
  database connections (plus the broker's threads and the lease keeper)
  however many runs it has in flight; the work of several runs that is
  ready at once is committed in one transaction
  (``runs.engine.group_commit``, at most ``ENGINE_GROUP_MAX`` runs);
* a model call, an async tool handler or a retry pause is awaited on the
  event loop, holding no thread; a sync handler runs in the bounded pool
  of ``runs.base.awaiting.run_blocking``;
* at most ``TOLLGATE["RUNS_IN_FLIGHT"]`` runs are in flight: ``submit``
  blocks the broker's thread while they are, which stops the process from
  taking more messages (back-pressure; the others stay in the queue).

Nothing of a run lives only here: its lease (renewed by the process's
keeper, ``runs.lease``) and its rows are the truth. A process that dies
with runs in flight leaves leases that expire; the sweeper hands those
runs to other workers (``runs.engine.sweep_jobs.rescue_stranded``), as
for a thread that died before.

The pattern (one event loop per process multiplexing I/O-bound tasks,
blocking work in a bounded executor) is asyncio's own
(``loop.run_in_executor``); the database stays synchronous Django ORM.
"""

import asyncio
import contextvars
import dataclasses
import logging
import threading
import time

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from django_fsm import ConcurrentTransition

from runs import lease

from runs.base import flight_recorder, log_context, process_metrics
from runs.base.awaiting import Await, hand_back_unless_kept, holding_connection, resume, settle
from runs.engine.group_commit import GroupCommit
from runs.engine.lifecycle import end_run
from runs.engine.loop import RUN_READING, advance_slice, hand_back
from runs.lease import LeaseLost
from runs.models import FailureType, Run
from runs.wakeups import quarantine_queue, wake_now, wake_on_commit

log = logging.getLogger(__name__)
RETRY_AFTER_DB_ERROR_MS = 2000
# Seconds between two looks for cancels requested on runs waiting for a call (one query for all of them).
CANCEL_POLL_S = 0.5
# Seconds a hand-over waits for room in a full engine before the run is sent to the queue again (well
# within the actor's time limit, so the broker never cuts a hand-over off half-way).
SUBMIT_WAIT_S = 60


class EngineFull(Exception):
    """The engine had no room for another run within ``SUBMIT_WAIT_S``."""


class Engine:
    """Runs in flight in this process (see the module's docstring).

    ``runs_in_flight``: how many at most; ``db_threads``: the threads (and
    database connections) for their database work; ``group_max``: how many
    runs' jobs one of them commits together at most (``group_commit``).
    """

    def __init__(self, *, runs_in_flight: int, db_threads: int, group_max: int = 1):
        self._slots = threading.BoundedSemaphore(runs_in_flight)
        self.db = GroupCommit(threads=db_threads, max_group=group_max)
        self._loop = asyncio.new_event_loop()
        self._changed = threading.Condition()
        self._in_flight = 0
        self._handing_over = 0  # ``submit`` calls not returned yet (``wait_idle``)
        # The leases of the suspects advanced (or waiting to be) with no other run in flight: a lease, not a
        # run id, names one slice (two slices of one run may be in flight for a moment: ``_Slice``).
        self._quarantine: set[lease.Lease] = set()
        self._quarantined = 0  # of which in flight now
        self._alone_waiting = 0  # blamed suspects waiting for the process to themselves
        self.submitted = 0  # runs handed over since the process started
        self.isolated = 0  # of which advanced in quarantine
        self.forwarded = 0  # suspects sent on to the quarantine queue
        self._awaiting: set[_Slice] = set()  # slices waiting for a call now
        try:  # whose code runs in which thread, read by the sweeper if the process dies (recovery.attribute_deaths)
            flight_recorder.open_box(lease.WORKER_ID)
        except OSError:
            log.warning("no flight recorder (%s): a death here is blamed by the order of starts",
                        settings.TOLLGATE["FLIGHT_RECORDER_DIR"], exc_info=True)
        # A call's own tasks and its work in the default executor are noted as its code too.
        self._loop.set_task_factory(flight_recorder.task_factory)
        self._loop.set_default_executor(flight_recorder.RecordingExecutor(thread_name_prefix="tollgate-default"))
        threading.Thread(target=self._loop.run_forever, name="tollgate-engine", daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._watch_cancels(), self._loop)

    @property
    def in_flight(self) -> int:
        """Runs being advanced now."""
        return self._in_flight

    @property
    def quarantine(self) -> frozenset[int]:
        """The ids of the suspects advanced in quarantine now, or waiting for the process to empty (``submit``)."""
        with self._changed:
            return frozenset(held.run_id for held in self._quarantine)

    def submit(self, run_id: int, *, quarantine_worker: bool = False) -> lease.Lease | None:
        """Take run ``run_id``'s lease and advance it in this process; returns once it is under way.

        In the calling thread, the lease is taken and the slice's first database work done, up to its
        first call (a model or tool call, a pause): a run resumed by a decision starts its tool's
        checks without a hop to the loop and back. Its calls and the rest go on on the loop.
        Returns the lease (released when the slice ends), or None when the run was not taken (held
        elsewhere, waiting, ended or gone). Waits for room (``runs_in_flight``) before taking the lease,
        at most ``SUBMIT_WAIT_S`` seconds, then raises ``EngineFull``. A suspect (``Lease.suspect``) is
        advanced in quarantine, with other suspects only (``_take``; docs/design.md#recovery-and-the-sweeper,
        "Quarantine"); when suspects have a queue of
        their own (``TOLLGATE["QUARANTINE_QUEUE"]``), it is given back and sent there instead, unless
        ``quarantine_worker`` (it came from that queue). Raises ``DatabaseError`` from taking the lease.

        The calling thread's database connection is handed back to the pool once the slice is under way, unless
        the thread keeps its connection (``awaiting.keep_connection_in_this_thread``: a Dramatiq worker thread).
        """
        with self._changed:
            self._handing_over += 1
        try:
            return self._submit(run_id, quarantine_worker)
        finally:
            try:
                hand_back_unless_kept()
            finally:
                with self._changed:
                    self._handing_over -= 1
                    if self._handing_over == 0:  # only ``wait_idle`` waits for this
                        self._changed.notify_all()

    def _submit(self, run_id: int, quarantine_worker: bool) -> lease.Lease | None:
        deadline = time.monotonic() + SUBMIT_WAIT_S
        if not self._slots.acquire(timeout=SUBMIT_WAIT_S):
            raise EngineFull(f"{self._in_flight} runs in flight for {SUBMIT_WAIT_S} s")
        try:
            held = self._take(run_id, deadline, forward=not quarantine_worker and bool(quarantine_queue()))
        except BaseException:
            self._slots.release()
            raise
        if held is None:
            self._slots.release()
            return None
        with log_context.bound(run_id):  # the slice's log ids, noted by its work in any thread
            context = contextvars.copy_context()
        try:
            steps, call, more, failure = context.run(_first_work, held)
        except BaseException:  # the thread itself is being stopped: the lease runs out, the sweeper sends the run
            self._uncount(held)
            self._slots.release()
            raise
        if call is not None:  # the rest goes on on the loop, in the slice's context
            context.run(asyncio.run_coroutine_threadsafe, self._advance(held, steps, call), self._loop)
        else:  # the slice ended (or failed) before any call: no task, no hop
            context.run(self._end_slice, held, more, failure)
        return held

    def _take(self, run_id: int, deadline: float, *, forward: bool = False) -> lease.Lease | None:
        """The lease of ``run_id`` with the run counted in flight, or None (not taken, or a suspect sent on to
        the quarantine queue, with ``forward``). Raises ``EngineFull`` past ``deadline`` (monotonic).

        The lease says whether the run is a suspect. A suspect (``Lease.suspect``) joins the process's
        quarantine and waits until no other run is in flight; while a quarantine is on, no other run
        starts, so if a suspect kills the process only suspects die with it, and the flight recorder names
        the one whose code ran (``runs.engine.recovery.attribute_deaths``). A quarantine takes up to
        ``TOLLGATE["QUARANTINE_SIZE"]`` suspects together, those that come while it waits for the process
        to empty included (one drain serves them all), but a blamed one (``Lease.blamed``) is advanced
        alone, and no suspect joins a quarantine one waits to have to itself. A run that waits keeps its
        lease renewed; past the deadline it is given back (one that replaced an abandoned lease as it was found,
        so that the next taker still finds a suspect, blamed: ``_give_back``).
        """
        held = lease.acquire(run_id, reading=RUN_READING)
        if held is None:
            return None
        if held.suspect and forward:  # a process of the quarantine queue's empties for it, not this one
            _give_back(held)
            wake_now(run_id, suspect=True)
            with self._changed:
                self.forwarded += 1
            return None
        with self._changed:
            self.submitted += 1
            if not held.suspect and not self._quarantine:  # the common case: nothing to wait for
                self._in_flight += 1
                return held
        try:
            with lease.renewed(held), self._changed:
                try:
                    self._join(held, deadline)
                except BaseException:
                    self._quarantine.discard(held)
                    self._changed.notify_all()
                    raise
        except BaseException:
            _give_back(held)  # after the engine's lock is let go: a database statement
            raise
        if held.suspect:
            log.warning("run %s: its worker died on it before; it is advanced in quarantine%s", run_id,
                        " alone" if held.blamed else "")
        return dataclasses.replace(held, run=None)  # it waited: the slice reads its run afresh

    def _join(self, held: lease.Lease, deadline: float) -> None:
        """Wait (holding ``_changed``) until ``held``'s run may start (``_take``), then count it in flight."""
        if not held.suspect:
            self._wait(lambda: not self._quarantine, deadline)
            self._in_flight += 1
            return
        if held.blamed:
            self._alone_waiting += 1
            try:
                self._wait(lambda: not self._quarantine, deadline)
            finally:
                self._alone_waiting -= 1
        else:
            self._wait(lambda: not self._alone_waiting and self._has_room(), deadline)
        self._quarantine.add(held)
        self._changed.notify_all()
        self._wait(lambda: self._in_flight == self._quarantined, deadline)
        self._in_flight += 1
        self._quarantined += 1
        self.isolated += 1

    def _has_room(self) -> bool:
        """Whether a suspect that is not blamed may join the quarantine now (``_take``; ``_changed`` held)."""
        return (len(self._quarantine) < settings.TOLLGATE["QUARANTINE_SIZE"]
                and not any(member.blamed for member in self._quarantine))

    def _uncount(self, held: lease.Lease) -> None:
        """The slice of ``held`` is no longer in flight."""
        with self._changed:
            self._in_flight -= 1
            if held in self._quarantine:
                self._quarantine.discard(held)
                self._quarantined -= 1
            self._changed.notify_all()

    def _wait(self, ready, deadline: float) -> None:
        """Wait (holding ``_changed``) until ``ready()``; raises ``EngineFull`` past ``deadline``."""
        if not self._changed.wait_for(ready, timeout=max(0.0, deadline - time.monotonic())):
            raise EngineFull(f"no room to advance a run for {SUBMIT_WAIT_S} s")

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until the engine is at rest (at most ``timeout_s`` seconds); True if it is.

        At rest: no run in flight, no hand-over under way (a ``submit`` that has not returned: one waiting
        for room or for the process to empty, a run not counted in flight yet, included), and no job on
        the database threads (``GroupCommit.wait_idle``: a slice's end, a look for cancels). Nothing of
        the engine then touches the database until the next ``submit``, so a test may empty its tables; the
        process's lease keeper (``runs.lease``) renews none of its leases any more (a renewal it began
        before may still be ending: one statement, on the runs' table only). Runs in flight alone are
        ``in_flight``.
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            if not self._changed.wait_for(lambda: self._in_flight == 0 and self._handing_over == 0,
                                          timeout=timeout_s):
                return False
        # With no slice in flight the engine queues no job (a look for cancels needs a slice waiting for a call).
        return self.db.wait_idle(max(0.0, deadline - time.monotonic()))

    def close_connections(self) -> None:
        """Close the database connection of every database thread (e.g. before a test database is dropped).

        Call it only while the engine is at rest (``wait_idle``).
        """
        self.db.close_connections()

    async def _in_db_thread(self, fn, *args):
        """``fn(*args)`` on a database thread, in a copy of this task's context (its lease), committed
        with whatever other runs' work is ready then (``group_commit``)."""
        return await asyncio.wrap_future(self.db.submit(fn, *args))

    def _end_slice(self, held: lease.Lease, more: bool, failure: Exception | None) -> None:
        """In the broker's thread, a slice that ended in its first work: ``_after_slice``, and the run is no
        longer in flight."""
        try:
            _after_slice(held, more, failure)
        except Exception:  # the lease expires on its own; the sweeper sends the run back
            log.exception("run %s: ending its slice failed", held.run_id)
        finally:
            self._uncount(held)
            self._slots.release()

    async def _advance(self, held: lease.Lease, steps, call: Await) -> None:
        """The rest of a slice whose first work (``_first_work``) stopped at ``call``: ``_drive``, then
        ``_after_slice`` on a database thread."""
        more, failure = False, None
        try:
            with process_metrics.run_in_flight(), lease.kept(held):
                _run, more = await self._drive(_Slice(held.run_id), steps, call)
        except Exception as exc:
            failure = exc
        finally:
            try:
                await self._in_db_thread(_after_slice, held, more, failure)
            except Exception:  # the lease expires on its own; the sweeper sends the run back
                log.exception("run %s: ending its slice failed", held.run_id)
            self._uncount(held)
            self._slots.release()

    async def _drive(self, this: "_Slice", steps, call: Await):
        """Run the step generator ``steps`` of the slice ``this``, stopped at ``call``, to its end: its
        calls awaited here, each cut short when the run's cancel is requested meanwhile
        (``_watch_cancels``), its database work on the database threads. Returns what the generator
        returns."""
        while True:
            self._awaiting.add(this)
            try:
                answer = await settle(call, this.cancelled)
            finally:
                self._awaiting.discard(this)
            done, value = await self._in_db_thread(resume, steps, answer)
            if done:
                return value
            call = value

    async def _watch_cancels(self) -> None:
        """Every ``CANCEL_POLL_S``, one query: which runs waiting for a call had their cancel requested
        (a person, the API, a newer run's ``interrupt`` strategy); their calls are cut short."""
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            try:
                waiting = [this for this in self._awaiting if not this.cancelled.is_set()]
                requested = set(await self._in_db_thread(_cancel_requested, list({this.run_id for this in waiting}))
                                if waiting else ())
                for this in waiting:
                    if this.run_id in requested:
                        this.cancelled.set()
            except Exception:  # a database blip, or a bug: logged, and the next look tries again
                log.exception("looking for cancels failed")


class _Slice:
    """One slice of a run in flight: ``run_id`` and ``cancelled``, set once its cancel is requested. Two
    slices of one run may be in flight in one process for a moment (the first one's lease expired and
    the run was taken over): each has its own."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.cancelled = asyncio.Event()


def _give_back(held: lease.Lease) -> None:
    """``lease.give_back(held)`` (a run that never started here: left as it was found); a failure leaves the
    lease to run out."""
    try:
        lease.give_back(held)
    except Exception:
        log.exception("run %s: giving its lease back failed; it runs out", held.run_id)


def _first_work(held: lease.Lease) -> tuple[object, Await | None, bool, Exception | None]:
    """A slice of ``held``'s run (``advance_slice``) started, and its first database work done, in the
    thread that took the lease (the broker's), alone as a group of one is (``group_commit``: its
    transactions commit as it makes them).

    Returns ``(steps, the call it stopped at, False, None)``; ``(steps, None, more, None)`` when the
    slice ended before any call (``more``: as ``advance_slice`` returns it); ``(None, None, False, the
    exception)`` when it raised.
    """
    with process_metrics.run_in_flight(), lease.kept(held):
        try:
            steps = advance_slice(held.run_id, held.run)
            # The connection minded as on a database thread: one a database error broke is closed, so that
            # ending the slice (the lease given back, the run woken) connects afresh.
            done, value = holding_connection(resume, steps, None)
        except Exception as exc:
            return None, None, False, exc
    return (steps, None, value[1], None) if done else (steps, value, False, None)


def _cancel_requested(run_ids: list[int]) -> list[int]:
    """Those of ``run_ids`` whose cancel was requested."""
    return list(Run.objects.filter(pk__in=run_ids, cancel_requested_at__isnull=False).values_list("pk", flat=True))


def _after_slice(held: lease.Lease, more: bool, failure: Exception | None) -> None:
    """Release ``held`` and hand the run back (``hand_back``), or deal with the ``failure`` that ended
    the slice (``settle_failure``). Runs on a database thread."""
    released = lease.release(held)
    if failure is None:
        hand_back(held.run_id, more=more, released=released)
    else:
        settle_failure(held.run_id, failure)


def settle_failure(run_id: int, exc: Exception) -> None:
    """What an exception that stopped advancing run ``run_id`` means (the lease already released).

    ``LeaseLost`` or ``ConcurrentTransition``: another worker or a person
    moved the run first: it is left to them. ``DatabaseError``: likely
    transient (a restart, a failover): the run is looked at again in
    ``RETRY_AFTER_DB_ERROR_MS`` (a step cut off here is counted by the next
    takeover's crash streak, so this stays bounded). Anything else fails
    the run with ``internal_error`` rather than leaving it stuck, unless
    another worker holds its lease by now.
    """
    if isinstance(exc, (LeaseLost, ConcurrentTransition)):
        log.info("run %s changed under this worker (%s); leaving it", run_id, exc)
        return
    if isinstance(exc, DatabaseError):
        log.error("database error advancing run %s; trying again in %s ms", run_id, RETRY_AFTER_DB_ERROR_MS,
                  exc_info=exc)
        wake_on_commit(run_id, delay_ms=RETRY_AFTER_DB_ERROR_MS)
        return
    log.error("advancing run %s failed", run_id, exc_info=exc)
    run = Run.objects.get(pk=run_id)
    if run.is_terminal or (run.lease_expires_at is not None and run.lease_expires_at > timezone.now()):
        return
    end_run(run.fail, actor="worker", reason="internal error", failure_type=FailureType.INTERNAL_ERROR,
            error=f"An internal error stopped the run ({type(exc).__name__}); operators find it in the log.")


_engine: Engine | None = None
_engine_lock = threading.Lock()


def engine() -> Engine:
    """This process's engine, started on first use with the ``TOLLGATE`` settings."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine(runs_in_flight=settings.TOLLGATE["RUNS_IN_FLIGHT"],
                             db_threads=settings.TOLLGATE["ENGINE_DB_THREADS"],
                             group_max=settings.TOLLGATE["ENGINE_GROUP_MAX"])
        return _engine


def running_engine() -> Engine | None:
    """This process's engine if it was started, else None (nothing is started)."""
    return _engine
