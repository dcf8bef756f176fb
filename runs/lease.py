"""Run leases with fencing tokens: one worker advances a run at a time.

A worker takes a run's lease with one conditional UPDATE (free or expired
lease, run still active); ``lease_token`` grows by one on every
acquisition. While the lease is held, ``current_token()`` names it, and the
services that write for the worker (``append_events``, ``append_message``,
``set_phase``) do so only if the row still carries that token, raising
``LeaseLost`` otherwise — which rolls the whole transaction back. A worker
that was paused, partitioned or just slow past its lease therefore changes
nothing once another worker holds the run. A heartbeat thread extends the
lease while the worker is busy (e.g. inside a long model or tool call).

The pattern is Martin Kleppmann's fencing token ("How to do distributed
locking", 2016), with the database as the storage that checks the token.
"""

import contextlib
import contextvars
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.db.models import F, Q
from django.utils import timezone

from runs.models import Run, RunStatus

log = logging.getLogger(__name__)

_current: contextvars.ContextVar["Lease | None"] = contextvars.ContextVar("tollgate_lease", default=None)
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LeaseLost(Exception):
    """This worker's lease on the run was taken over; its writes were refused."""


@dataclass(frozen=True)
class Lease:
    """A held lease: ``run_id``, the fencing ``token`` and the ``owner`` string."""

    run_id: int
    token: int
    owner: str


ACTIVE = (RunStatus.QUEUED.value, RunStatus.RUNNING.value)  # the statuses a worker advances


def ttl() -> timedelta:
    """The lease time-to-live (``TOLLGATE["LEASE_TTL_S"]`` seconds)."""
    return timedelta(seconds=settings.TOLLGATE["LEASE_TTL_S"])


def acquire(run_id: int, owner: str = WORKER_ID) -> Lease | None:
    """Take the lease of a queued or running run whose lease is free or expired.

    Returns None when another worker holds it or the run is waiting,
    finished or gone (a waiting run needs a person or a timer, not a
    worker). One statement (``UPDATE ... RETURNING`` the new token) where
    the database can return rows from a write, else an UPDATE and a SELECT.
    """
    now = timezone.now()
    expires_at = now + ttl()
    if not connection.features.can_return_columns_from_insert:
        free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now)
        if Run.objects.filter(free, pk=run_id, status__in=ACTIVE).update(
                lease_owner=owner, lease_token=F("lease_token") + 1, lease_expires_at=expires_at) != 1:
            return None
        token = Run.objects.values_list("lease_token", flat=True).get(pk=run_id)
        return Lease(run_id=run_id, token=token, owner=owner)
    quote, meta = connection.ops.quote_name, Run._meta
    pk, status, lease_owner, token, expires = (quote(meta.get_field(name).column) for name in (
        "id", "status", "lease_owner", "lease_token", "lease_expires_at"))
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(meta.db_table)} SET {lease_owner} = %s, {token} = {token} + 1, {expires} = %s "
            f"WHERE {pk} = %s AND {status} IN (%s, %s) AND ({expires} IS NULL OR {expires} < %s) RETURNING {token}",
            [owner, adapt(expires_at), run_id, *ACTIVE, adapt(now)])
        row = cursor.fetchone()
    return Lease(run_id=run_id, token=row[0], owner=owner) if row else None


def renew(lease: Lease) -> bool:
    """Extend ``lease`` by one TTL; False if it was lost."""
    return Run.objects.filter(pk=lease.run_id, lease_token=lease.token).update(
        lease_expires_at=timezone.now() + ttl()
    ) == 1


def release(lease: Lease) -> None:
    """Give the lease up (no-op if it was already taken over)."""
    Run.objects.filter(pk=lease.run_id, lease_token=lease.token).update(lease_owner="", lease_expires_at=None)


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
    """Make ``lease`` this thread's current lease and heartbeat it until the block ends.

    Releases the lease on exit. The heartbeat renews every third of the
    TTL from its own thread and database connection.
    """
    stop = threading.Event()
    interval = settings.TOLLGATE["LEASE_TTL_S"] / 3

    def heartbeat():
        try:
            while not stop.wait(interval):
                try:
                    if not renew(lease):
                        log.warning("run %s: lease %s lost", lease.run_id, lease.token)
                        return
                except DatabaseError:  # a blip: try again at the next beat, the TTL has slack
                    log.warning("run %s: heartbeat failed", lease.run_id, exc_info=True)
                    connection.close()
        finally:
            connection.close()

    beat = threading.Thread(target=heartbeat, name=f"lease-{lease.run_id}", daemon=True)
    reset = _current.set(lease)
    beat.start()
    try:
        yield lease
    finally:
        stop.set()
        _current.reset(reset)
        beat.join()
        close_old_connections()
        release(lease)
