"""What a step waits for outside the database: one model call, tool call or pause, awaited by the engine.

The engine's steps are generators (``runs.engine.loop``). Where a step
needs an answer from outside the database it yields an ``Await`` and is
resumed with the answer (``generator.send``) or with the exception the
awaitable raised (``generator.throw``), at its timeout ``Await.timed_out()``.
Between two yields a step only reads and writes the database, and no
transaction is open across a yield, so the engine may resume a step on
any of its database threads while other runs' calls are in flight
(``runs.engine.runtime``), or drive it in the caller's own thread with a
private event loop (``drive``, used by ``runs.engine.loop.advance``).

Sync tool handlers run in a bounded pool of threads (``run_blocking``):
a handler that outlives its timeout cannot be stopped, so its thread is
*abandoned* (left to finish, its answer dropped) and counted in
``abandoned_threads()`` for operators.

Whose code a thread runs (a step's database work in ``resume``, a call in
``settle`` and ``run_blocking``) is noted in the process's flight recorder
(``runs.base.flight_recorder``), so a death can be blamed on the run whose
code was running.
"""

import asyncio
import contextlib
import contextvars
import logging
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Awaitable, Callable, Generator

from django.conf import settings
from django.db import connection
from django.utils import timezone

from runs.base import flight_recorder, log_context, process_metrics, tracing

log = logging.getLogger(__name__)


def full_jitter(base_s: float, attempt: int) -> float:
    """Seconds to wait before try ``attempt + 1`` after ``attempt`` (1 or more) failed: a random delay in
    ``[0, base_s * 2**(attempt-1)]``. Source: "Exponential Backoff And Jitter", AWS Architecture Blog (2015)."""
    return random.uniform(0, base_s * 2 ** max(attempt - 1, 0))


class Interrupted(Exception):
    """The run stopped waiting for a call before it answered: its deadline passed, or a cancel was
    requested. Thrown into the step at its ``yield`` (the call's awaitable was cancelled first)."""


@dataclass(frozen=True)
class Await:
    """One call a step waits for: ``start()`` makes the awaitable (on the engine's loop); ``timeout_s``: seconds (None: no limit).

    ``timed_out()``: the exception thrown into the step past it (the awaitable cancelled first); ``stop_at``: aware datetime
    (the run's deadline) past which the step gets ``Interrupted``; ``what``: a log label (``model``, ``tool:<name>``).
    """

    start: Callable[[], Awaitable[Any]]
    timeout_s: float | None = None
    timed_out: Callable[[], BaseException] = TimeoutError
    stop_at: datetime | None = None
    what: str = ""


# A step: yields ``Await``s, is sent their answers, returns its result.
Steps = Generator[Await, Any, Any]


async def _nothing() -> None:
    return None


def commit_point() -> Await:
    """An ``Await`` of nothing: after ``yield commit_point()`` the step's writes so far are committed (docs/design.md#the-loop)."""
    return Await(start=_nothing, what="commit")


async def settle(request: Await, cancelled: asyncio.Event | None = None) -> tuple[bool, Any]:
    """Await ``request``: ``(True, answer)``, or ``(False, the exception for the step)``.

    The exception is what the awaitable raised; ``request.timed_out()``
    past its ``timeout_s``; ``Interrupted`` past its ``stop_at`` or once
    ``cancelled`` is set (the run's cancel was requested). In the last
    three cases the awaitable is cancelled first and given ``CANCEL_GRACE_S``
    to end (one that ignores its cancel is left running, its answer dropped). The run's
    own task being cancelled (``asyncio.CancelledError``) propagates.
    """
    timeout_s, deadline = request.timeout_s, None
    if request.stop_at is not None:
        left = (request.stop_at - timezone.now()).total_seconds()
        if timeout_s is None or left < timeout_s:
            timeout_s, deadline = max(left, 0.0), left
    # The call's task (and its HTTP requests) in the run's trace; its code, and that of the task the engine's
    # loop makes of it, noted in the flight recorder (``flight_recorder.task_factory``).
    with tracing.attached(), flight_recorder.executing(flight_recorder.CALL):
        call = asyncio.ensure_future(request.start())
    watch = asyncio.ensure_future(cancelled.wait()) if cancelled is not None else None
    try:
        done, _ = await asyncio.wait([call] if watch is None else [call, watch], timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        if watch is not None:
            watch.cancel()
    if call in done:
        return (True, call.result()) if call.exception() is None else (False, call.exception())
    call.cancel()
    await _let_go(call, request.what)
    if watch is not None and watch in done:
        return False, Interrupted("the run's cancel was requested")
    if deadline is not None:
        return False, Interrupted("the run's deadline passed")
    return False, request.timed_out()


# Seconds a cancelled call may take to wind down before the step goes on without it.
CANCEL_GRACE_S = 2.0


async def _let_go(call: asyncio.Future, what: str) -> None:
    """Wait (at most ``CANCEL_GRACE_S``) for the cancelled ``call`` to end; one that ignores its cancel
    (swallows ``CancelledError``) is left running on the loop, its answer dropped. The run's own task
    being cancelled meanwhile propagates."""
    await asyncio.wait([call], timeout=CANCEL_GRACE_S)
    if call.done():
        if not call.cancelled():
            call.exception()  # retrieved: what a cancelled call raised on its way out is dropped
        return
    log.warning("a call (%s) ignored its cancel; it is left running and its answer dropped", what or "?")
    call.add_done_callback(lambda done: done.cancelled() or done.exception())


_resumption: contextvars.ContextVar[object | None] = contextvars.ContextVar("tollgate_resumption", default=None)


def current_resumption() -> object | None:
    """A token of the ``resume`` call running now, a new one for each (None outside any): two reads within one
    stretch of a step's code, between two ``Await`` objects, get the same token; across one, different ones."""
    return _resumption.get()


def resume(steps: Steps, answer: tuple[bool, Any] | None) -> tuple[bool, Any]:
    """Resume ``steps`` with ``answer`` (None: start it), as ``settle`` gave it.

    Returns ``(False, the next Await)``, or ``(True, the step's result)``
    once it finished; raises whatever the step raised.
    """
    stretch = _resumption.set(object())  # this stretch of the step's code, up to its next Await (current_resumption)
    try:
        # The step's queries in the run's trace; its work noted in the flight recorder.
        with tracing.attached(), flight_recorder.executing(flight_recorder.STEP):
            if answer is None:
                return False, next(steps)
            ok, value = answer
            return False, (steps.send(value) if ok else steps.throw(value))
    except StopIteration as stop:
        return True, stop.value
    finally:  # None again once it stopped: the thread's later code (drive's calls, ending the slice) is no stretch
        _resumption.reset(stretch)


_local = threading.local()


def drive(steps: Steps):
    """Run ``steps`` to its end in this thread; each ``Await`` on this thread's own event loop.

    Returns the step's result. For callers outside the engine's runtime
    (tests, one-off commands): the thread is held while calls are awaited.
    """
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    answer = None
    while True:
        done, value = resume(steps, answer)
        if done:
            return value
        answer = loop.run_until_complete(settle(value))


def keeping_connection(fn: Callable, *args):
    """``fn(*args)`` in a long-lived thread of a pool of threads, minding its database connection.

    With a connection pool (PostgreSQL, ``OPTIONS["pool"]``) the
    connection goes back to the pool after every job, so threads that wait
    hold none and a process needs no more connections than it has jobs
    running. Without one (SQLite) the thread keeps its connection. After a
    database error a connection that no longer works (a database restart)
    is closed, so the thread's next job connects afresh (``holding_connection``).
    """
    try:
        return holding_connection(fn, *args)
    finally:
        if _pooled_and_open():
            connection.close()  # back to the pool


_keeper = threading.local()  # ``keeps``: this thread keeps its database connection between jobs


def keep_connection_in_this_thread() -> None:
    """Let the calling thread keep its database connection from one job to the next (``hand_back_unless_kept``
    then leaves it open). Only for a long-lived thread that closes its connections when it stops (a Dramatiq
    worker thread: ``runs.engine.worker_middleware.ConnectionsMiddleware``)."""
    _keeper.keeps = True


def hand_back_unless_kept() -> None:
    """Hand the calling thread's database connection back to PostgreSQL's pool, unless the thread keeps it
    (``keep_connection_in_this_thread``): a thread nobody closes (one a script or a test started) must not
    hold a pooled connection after its work is done. Without a pool (SQLite), or inside a transaction (the
    caller's, which the connection must outlive), nothing."""
    if not getattr(_keeper, "keeps", False) and _pooled_and_open() and not connection.in_atomic_block:
        connection.close()


def _pooled_and_open() -> bool:
    """Whether this thread has an open database connection taken from a pool (closing it hands it back)."""
    return connection.connection is not None and getattr(connection, "pool", None) is not None


def holding_connection(fn: Callable, *args):
    """``fn(*args)`` in one of a fixed, small set of threads that each keep their database connection from
    one job to the next (the engine's database threads, ``runs.engine.group_commit``), pool or not.

    A thread that does nothing but database work gains nothing by handing its connection back: it
    needs one again at its next job, and a connection it keeps keeps its prepared statements and
    PostgreSQL's cached plans, where the pool would hand it the connection used least recently
    (psycopg's pool is first in, first out), on which they are not made yet. The process then holds
    one connection per such thread (``docs/operating.md``). After every job, whatever it returned or
    raised (a job may catch a database error and answer with it), a connection that an error left
    unusable (the server ended its session: a restart, a failover) is closed, so the thread's next
    job connects afresh (``close_if_unusable``), as the pool would have done.
    """
    try:
        return fn(*args)
    finally:
        close_if_unusable(connection)


def close_if_unusable(db) -> None:
    """Close the Django connection ``db`` (a ``DatabaseWrapper``) if it is open but not fit for the next job:
    not back in autocommit (a transaction left open), or not answering after a database error since it
    was last checked (one ``SELECT 1``; a connection that answers is kept and its errors forgotten).

    Django's ``close_if_unusable_or_obsolete``, without its age rule: with a pool every connection is
    past its age at once, and closing it would hand it back after every job.
    """
    if db.connection is None:
        return
    if db.get_autocommit() != db.settings_dict["AUTOCOMMIT"]:
        db.close()
    elif db.errors_occurred:
        if db.is_usable():
            db.errors_occurred = False
        else:
            db.close()


def close_pool_connections(executor: ThreadPoolExecutor, threads: int, *, timeout_s: float = 10) -> None:
    """Close the database connection of each of ``executor``'s ``threads`` idle threads.

    Each thread takes one job and the jobs wait for each other (a
    barrier), so every thread closes its own connection (Django's
    connections belong to their thread). Gives up after ``timeout_s`` when
    fewer threads are free (one is stuck in an abandoned call).
    """
    barrier = threading.Barrier(threads)

    def close() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout_s)
        connection.close()

    for future in [executor.submit(close) for _ in range(threads)]:
        with contextlib.suppress(TimeoutError):
            future.result(timeout_s)


class _BlockingPool:
    """The threads sync tool handlers and hooks run in (``TOLLGATE["TOOL_THREADS"]``), and those abandoned."""

    def __init__(self):
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self.abandoned = 0

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(settings.TOLLGATE["TOOL_THREADS"],
                                                    thread_name_prefix="tollgate-tool")
            return self._executor

    async def run(self, fn: Callable, *args):
        # The handler's log lines carry the run's ids (not the rest of the context: the lease stays with the step).
        future = self.executor().submit(log_context.run_with, log_context.current(), flight_recorder.run,
                                        flight_recorder.CALL, tracing.in_run_trace, keeping_connection, fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.cancel():  # already running: it cannot be stopped, only left
                with self._lock:
                    self.abandoned += 1
                process_metrics.tool_thread_abandoned()
                log.warning("a sync handler (%s) outlived its timeout; its thread is abandoned",
                            getattr(fn, "__qualname__", fn))
                future.add_done_callback(self._settled)
            raise

    def _settled(self, _future) -> None:
        with self._lock:
            self.abandoned -= 1
        process_metrics.tool_thread_settled()

    def close_connections(self) -> None:
        if self._executor is not None:
            close_pool_connections(self._executor, self._executor._max_workers - self.abandoned)


_pool = _BlockingPool()


async def run_blocking(fn: Callable, *args):
    """Await ``fn(*args)`` in the sync handler pool; cancelling abandons the thread (docs/design.md#async-tool-handlers)."""
    return await _pool.run(fn, *args)


def abandoned_threads() -> int:
    """How many sync handler threads are still running a call whose awaiter gave up (timed out)."""
    return _pool.abandoned


def close_connections() -> None:
    """Close the database connections of the sync handler pool's idle threads (e.g. before a test
    database is dropped)."""
    _pool.close_connections()
