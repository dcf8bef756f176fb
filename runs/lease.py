"""Run leases with fencing tokens: one worker advances a run at a time.

A worker takes a run's lease with one conditional UPDATE (free or expired
lease, run still active); ``lease_token`` grows by one on every
acquisition. While the lease is held, ``current_token()`` names it, and the
services that write for the worker (``append_events``, ``append_message``,
``set_phase``) do so only if the row still carries that token, raising
``LeaseLost`` otherwise — which rolls the whole transaction back. A worker
that was paused, partitioned or just slow past its lease therefore changes
nothing once another worker holds the run. One keeper thread per process
extends all the leases held in it while their runs are busy (e.g. inside
a long model or tool call).

The pattern is Martin Kleppmann's fencing token ("How to do distributed
locking", 2016), with the database as the storage that checks the token.
"""

import contextlib
import contextvars
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import F, Q
from django.utils import timezone

from runs.base import rows, selects
from runs.models import Run, RunStatus

log = logging.getLogger(__name__)

_current: contextvars.ContextVar["Lease | None"] = contextvars.ContextVar("tollgate_lease", default=None)
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LeaseLost(Exception):
    """This worker's lease on the run was taken over; its writes were refused."""


@dataclass(frozen=True)
class Lease:
    """A held lease: ``run_id``, the fencing ``token``, the ``owner`` string, and what the run's worker deaths
    say: ``suspect``, a worker died on it, maybe by its doing (``Run.suspect``), so it is advanced in
    quarantine; ``blamed``, a death was laid on it (``Run.crash_streak``), or it is a suspect that died
    ``ISOLATE_AFTER_LOSSES`` times in a row (each time beside others), so it is advanced alone. A run
    taken from a lease that ran out without being given back is both: its holder died on it and the
    takeover will blame it (docs/design.md#recovery-and-the-sweeper, "Quarantine"); ``replaced`` is then that
    lease, ``(owner, expiry)``, so that a run handed back before any of its code ran here is left as it was
    found (``give_back``), its holder's death still to be counted and the run still blamed. ``run``: the run read
    with the lease (``acquire(reading=...)``), else None; ``taken_at``: when its taking began (``time.monotonic()``,
    before any wait for the row, so never after the moment its expiry counts from) and ``ttl_s``: the TTL it was
    taken with (seconds), from which the keeper plans its first renewal. None of these three takes part in equality.
    """

    run_id: int
    token: int
    owner: str
    suspect: bool = False
    blamed: bool = False
    replaced: tuple[str, datetime] | None = None
    run: Run | None = field(default=None, compare=False, repr=False)  # read with the lease: ``acquire(reading=...)``
    taken_at: float = field(default_factory=time.monotonic, compare=False, repr=False)
    ttl_s: float = field(default_factory=lambda: settings.TOLLGATE["LEASE_TTL_S"], compare=False, repr=False)


ACTIVE = (RunStatus.QUEUED.value, RunStatus.RUNNING.value)  # the statuses a worker advances


def ttl() -> timedelta:
    """The lease time-to-live (``TOLLGATE["LEASE_TTL_S"]`` seconds)."""
    return timedelta(seconds=settings.TOLLGATE["LEASE_TTL_S"])


def acquire(run_id: int, owner: str = WORKER_ID, *, reading: selects.Reading | None = None) -> Lease | None:
    """Take the lease of a queued or running run whose lease is free or expired; with ``reading`` (of ``Run``),
    read the run too (``Lease.run``), in the same statement on PostgreSQL.

    Returns None when another worker holds it or the run is waiting,
    finished or gone (a waiting run needs a person or a timer, not a
    worker). The lease says whether the run is a suspect, and blamed
    (``Lease``): from its row, or because the lease it replaces had
    expired without being given back and the sweeper has not counted that
    death yet (``death_blame`` empty): its holder died on it (or stalled
    past the TTL), so the takeover will blame the run
    (``runs.engine.recovery.recover_after_takeover``). One
    statement on PostgreSQL (``UPDATE ... FROM ... RETURNING`` the new
    token, the streaks, the suspect flag, whether the old lease was still set, uncounted, and that lease), else a
    SELECT, an UPDATE and a SELECT (SQLite's RETURNING cannot name the FROM).
    """
    taken_at, ttl_s, now = time.monotonic(), settings.TOLLGATE["LEASE_TTL_S"], timezone.now()  # before any wait
    expires_at = now + timedelta(seconds=ttl_s)
    if connection.vendor != "postgresql":
        free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
        found = Run.objects.filter(pk=run_id).values_list("lease_owner", "lease_expires_at", "death_blame").first()
        if found is None:
            return None
        held_by, held_until, counted = found
        if Run.objects.filter(free, pk=run_id, status__in=ACTIVE).update(
                lease_owner=owner, lease_token=F("lease_token") + 1, lease_expires_at=expires_at) != 1:
            return None
        row = (*Run.objects.values_list("lease_token", "crash_streak", "loss_streak", "suspect", "death_blame").get(
            pk=run_id), held_until is not None and counted == "", held_by, held_until)
        run = _read_again(reading, run_id) if reading is not None else None
    else:
        run, row = _take_on_postgresql(run_id, owner, now, expires_at, reading)
        if row is None:
            return None
    if reading is not None and run is None:  # deleted since: nothing to advance
        return None
    token, crash_streak, loss_streak, suspect, counted, abandoned, held_by, held_until = row
    limits = settings.TOLLGATE
    if counted and (crash_streak >= limits["MAX_CRASHES_PER_STEP"] or loss_streak >= limits["MAX_LOSSES_PER_STEP"]):
        # Its death counted to the limit, with its work still in flight: the takeover ends it crash_loop
        # before any of its code runs (runs.engine.recovery.recover_after_takeover), so no quarantine.
        return Lease(run_id=run_id, token=token, owner=owner, run=run, taken_at=taken_at, ttl_s=ttl_s)
    # A suspect dead again and again beside others (each time a SUSPECT) is blamed too: advanced alone, its next
    # death is its own.
    blamed = crash_streak >= 1 or (suspect and loss_streak >= limits["ISOLATE_AFTER_LOSSES"])
    return Lease(run_id=run_id, token=token, owner=owner, suspect=bool(suspect) or bool(abandoned),
                 blamed=bool(blamed) or bool(abandoned), replaced=(held_by, held_until) if abandoned else None, run=run,
                 taken_at=taken_at, ttl_s=ttl_s)


_TAKEN = ("taken_token", "taken_crashes", "taken_losses", "taken_suspect", "taken_blame", "taken_abandoned",
          "taken_held_by", "taken_held_until", "taken_as_seen")


def _take_on_postgresql(run_id: int, owner: str, now: datetime, expires_at: datetime,
                        reading: selects.Reading | None) -> tuple[Run | None, tuple | None]:
    """``acquire``'s one statement: ``(the run read with reading, or None, acquire's row)``; ``(None, None)`` when
    the lease was not taken.

    The run comes from the same statement (``selects.select_written``) unless a transaction changed the run's
    row after the statement's snapshot was taken (while the UPDATE waited for the row's lock, say): then that
    snapshot, which the related rows and flags are read from, misses what the transaction wrote with it (every
    write under a lease, a step started with no event included, writes the run's row), and the run is read
    afresh. "Changed" is PostgreSQL's own word for it: the row version the snapshot sees was made by another
    transaction (``xmin``) than the one the statement locked (a ``FOR UPDATE`` subquery, which waits for the
    lock and then reads the newest version).
    """
    quote, meta = connection.ops.quote_name, Run._meta
    table = quote(meta.db_table)
    names = ("id", "status", "lease_owner", "lease_token", "lease_expires_at", "crash_streak", "loss_streak",
             "suspect", "death_blame")
    pk, status, lease_owner, token, expires, crashes, losses, suspect, blame = (
        quote(meta.get_field(name).column) for name in names)
    returned = [f"{table}.{token}", f"{table}.{crashes}", f"{table}.{losses}", f"{table}.{suspect}",
                f"{table}.{blame}", "replaced.held_until IS NOT NULL AND replaced.counted = ''", "replaced.held_by",
                "replaced.held_until", "replaced.seen = locked.newest"]
    returning = ", ".join(f"{expression} AS {quote(name)}" for expression, name in zip(returned, _TAKEN))
    adapt = connection.ops.adapt_datetimefield_value
    sql = (  # the FROM reads the lease being replaced (RETURNING sees only the new row)
        f"UPDATE {table} SET {lease_owner} = %s, {token} = {table}.{token} + 1, {expires} = %s "
        f"FROM (SELECT {lease_owner} AS held_by, {expires} AS held_until, {blame} AS counted, xmin AS seen "
        f"FROM {table} WHERE {pk} = %s) AS replaced, "
        f"(SELECT xmin AS newest FROM {table} WHERE {pk} = %s FOR UPDATE) AS locked "
        f"WHERE {table}.{pk} = %s AND {table}.{status} IN (%s, %s) "
        f"AND ({table}.{expires} IS NULL OR {table}.{expires} < %s) "
        f"RETURNING {table + '.*, ' if reading is not None else ''}{returning}")
    params = [owner, adapt(expires_at), run_id, run_id, run_id, *ACTIVE, adapt(now)]
    if reading is None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return None, None if row is None else row[:-1]
    found = selects.select_written(reading, sql, params, _TAKEN)
    if found is None:
        return None, None
    run, row = found
    return (run if row[-1] else _read_again(reading, run_id)), row[:-1]


def _read_again(reading: selects.Reading, run_id: int) -> Run | None:
    """``reading.one(run_id)``, or None when the run was deleted after its lease was taken."""
    try:
        return reading.one(run_id)
    except Run.DoesNotExist:
        return None


def release(lease: Lease) -> str | None:
    """Give the lease up; returns the run's status as the release left it, or None when the lease was no
    longer this one (taken over, or broken by the sweeper: nothing is written then). One statement
    (``UPDATE ... RETURNING``) where the database can return columns from a write."""
    if not connection.features.can_return_columns_from_insert:
        if not Run.objects.filter(pk=lease.run_id, lease_token=lease.token).update(lease_owner="",
                                                                                  lease_expires_at=None):
            return None
        return Run.objects.values_list("status", flat=True).get(pk=lease.run_id)
    return rows.update_columns(Run, lease.run_id, values={"lease_owner": "", "lease_expires_at": None},
                               increments={}, expected={"lease_token": lease.token}, returning="status")


def give_back(lease: Lease) -> None:
    """Give back a lease under which none of the run's code ran (the run was sent elsewhere, or never started).

    A lease that replaced an abandoned one (``Lease.replaced``: its holder died on it, not counted yet) is
    left as it was found, that holder's lease run out, in one UPDATE fenced by the token: freed, the run
    would reach its next taker as no suspect, or a suspect no longer blamed (advanced beside others), and
    the sweeper would never judge that death with the rest of its holder's. So the next taker, or the
    sweeper, counts it as if this lease had never been taken, and no lease runs out under a live holder.
    Any other lease is released (``release``). Writes nothing once the lease has changed hands; raises
    ``DatabaseError`` from the write.
    """
    if lease.replaced is None:
        release(lease)
        return
    owner, expired_at = lease.replaced
    Run.objects.filter(pk=lease.run_id, lease_token=lease.token).update(lease_owner=owner, lease_expires_at=expired_at)


def current_token(run_id: int) -> int | None:
    """The fencing token this thread holds for ``run_id``, or None when it holds no lease on it."""
    lease = _current.get()
    return lease.token if lease is not None and lease.run_id == run_id else None


def fenced(queryset, run_id: int):
    """Narrow a ``Run`` queryset to rows still carrying this thread's token for ``run_id``."""
    token = current_token(run_id)
    return queryset if token is None else queryset.filter(lease_token=token)


def check(run_id: int) -> None:
    """Raise ``LeaseLost`` if this thread holds a lease on ``run_id`` that the row no longer carries.

    Inside a transaction on PostgreSQL this also row-locks the run until
    commit, so the lease cannot change hands before this worker's writes land.
    """
    token = current_token(run_id)
    if token is None:
        return
    if Run.objects.filter(pk=run_id, lease_token=token).update(lease_owner=F("lease_owner")) != 1:
        raise LeaseLost(f"run {run_id}: lease token {token} is no longer current")


@contextlib.contextmanager
def holding(lease: Lease):
    """Hold ``lease`` in this context (``kept``) until the block ends, then release it."""
    with kept(lease):
        yield lease
    close_old_connections()
    release(lease)


@contextlib.contextmanager
def kept(lease: Lease):
    """Make ``lease`` this context's current lease, renewed by the process's keeper, until the block ends.

    Releases nothing: the caller does (``release``). Works in a thread as
    in an asyncio task (the current lease is a context variable, copied
    into the task and into the database work it hands to threads).
    """
    reset = _current.set(lease)
    try:
        with renewed(lease):
            yield lease
    finally:
        _current.reset(reset)


@contextlib.contextmanager
def renewed(lease: Lease):
    """Have the process's keeper renew ``lease`` until the block ends (without making it this context's
    current lease: nothing in the block writes under it). Releases nothing."""
    _keeper.add(lease)
    try:
        yield lease
    finally:
        _keeper.discard(lease)


def renew_all(leases) -> int:
    """Extend every lease of ``leases`` still held by its owner by one TTL; returns how many were.

    One UPDATE per owner (a process has one, ``WORKER_ID``). On PostgreSQL
    it skips the rows other transactions hold (``SKIP LOCKED``): a group
    commit holds its runs' rows, taken in no particular order, so waiting
    for one while holding others could close a circle; each row left out
    (busy, or taken over) then gets an UPDATE of its own, which waits
    holding no other row. A lease taken over by another worker carries
    that worker's owner, so it is not renewed.
    """
    by_owner: dict[str, list[int]] = {}
    for lease in leases:
        by_owner.setdefault(lease.owner, []).append(lease.run_id)
    expires_at = timezone.now() + ttl()
    renewed = 0
    for owner, ids in by_owner.items():
        if connection.vendor != "postgresql":  # SQLite serializes writers: nothing to skip
            renewed += Run.objects.filter(pk__in=ids, lease_owner=owner).update(lease_expires_at=expires_at)
            continue
        done = _renew_free(ids, owner, expires_at)
        renewed += len(done) + sum(Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_expires_at=expires_at)
                                   for run_id in ids if run_id not in done)
    return renewed


def _renew_free(ids: list[int], owner: str, expires_at) -> set[int]:
    """Renew the leases of ``owner`` on the runs ``ids`` whose rows no transaction holds; returns their ids.
    One statement (PostgreSQL: ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``)."""
    quote, meta = connection.ops.quote_name, Run._meta
    table = quote(meta.db_table)
    pk, lease_owner, expires = (quote(meta.get_field(name).column) for name in ("id", "lease_owner", "lease_expires_at"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {expires} = %s WHERE {pk} IN (SELECT {pk} FROM {table} "
            f"WHERE {pk} = ANY(%s) AND {lease_owner} = %s FOR UPDATE SKIP LOCKED) RETURNING {pk}",
            [connection.ops.adapt_datetimefield_value(expires_at), list(ids), owner])
        return {row[0] for row in cursor.fetchall()}


class _Keeper:
    """One thread per process that renews every lease held in it before a third of the TTL has passed since
    the lease was taken or last renewed.

    Replaces a heartbeat thread per run: a process with a thousand runs in
    flight renews them in one statement (``renew_all``), from its own
    database connection; when one lease is due, every lease held is
    renewed with it. A lease just taken is not renewed at once (its first
    renewal is due a third of the TTL after it was taken: ``Lease.taken_at``).
    A lease that leaves the keeper and comes back is counted from when it
    was taken again (it may be renewed sooner than needed, never later).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[Lease, int] = {}  # lease -> how many holders (a context may hold it twice)
        self._fresh: dict[Lease, tuple[float, float]] = {}  # lease held -> (when it was taken or last renewed
        # (time.monotonic), the TTL in seconds that expiry was set with)
        self._planned = 0.0  # when the keeper's current wait ends (time.monotonic)
        self._thread: threading.Thread | None = None
        self._woken = threading.Event()  # a lease came that is due before the current wait ends

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._held[lease] = self._held.get(lease, 0) + 1
            if lease not in self._fresh:
                self._fresh[lease] = (lease.taken_at, lease.ttl_s)
                if _due(self._fresh[lease]) < self._planned:
                    self._woken.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="lease-keeper", daemon=True)
                self._thread.start()

    def discard(self, lease: Lease) -> None:
        with self._lock:
            count = self._held.pop(lease, 0) - 1
            if count > 0:
                self._held[lease] = count
            else:
                self._fresh.pop(lease, None)

    def _beat(self) -> None:
        while True:
            with self._lock:
                self._woken.clear()
                first = min(map(_due, self._fresh.values()), default=None)
                self._planned = time.monotonic() + _third_of_ttl() if first is None else first
            self._woken.wait(max(0.0, self._planned - time.monotonic()))
            with self._lock:
                leases = list(self._held)
                due = min(map(_due, self._fresh.values()), default=float("inf")) <= time.monotonic()
            if not leases:  # idle: let go of the database until there is a lease again
                connection.close()
                continue
            if not due:  # woken by a lease that came: the wait is planned again
                continue
            started, ttl_s = time.monotonic(), settings.TOLLGATE["LEASE_TTL_S"]  # renew_all extends by this TTL
            try:
                renewed = renew_all(leases)
            except Exception:  # a blip (or a bug): try again in a while, the TTL has slack; the thread lives on
                log.warning("lease keeper: renewing %s leases failed", len(leases), exc_info=True)
                with contextlib.suppress(Exception):
                    connection.close()
                time.sleep(ttl_s / 9)
                continue
            with self._lock:
                for lease in leases:
                    if lease in self._fresh:
                        self._fresh[lease] = (started, ttl_s)
            if renewed < len(leases):
                log.info("lease keeper: %s of %s leases were taken over", len(leases) - renewed, len(leases))


def _third_of_ttl() -> float:
    return settings.TOLLGATE["LEASE_TTL_S"] / 3


def _due(fresh: tuple[float, float]) -> float:
    """When (``time.monotonic``) a lease taken or renewed at ``fresh[0]`` with a TTL of ``fresh[1]`` seconds is
    due for renewal: a third of the shorter of that TTL and today's (a TTL that shrank counts at once)."""
    when, ttl_s = fresh
    return when + min(ttl_s, settings.TOLLGATE["LEASE_TTL_S"]) / 3


_keeper = _Keeper()
