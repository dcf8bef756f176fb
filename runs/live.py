"""Push run changes to browsers and integrators over Channels.

Groups: ``run-<id>`` (one run's page and WebSocket), ``runs`` (the run
list and the inbox) and ``user-<id>`` (every socket of one user, told
``access.changed`` when that user's access may have changed). Messages are ``{"type": "run.update", "run": {...}}``
with the fields of ``run_snapshot``, and ``{"type": "run.delta", ...}`` for
streamed model output. Publishing never changes a run and never raises:
a browser that misses an update catches up on its next load.

Writers do not publish themselves: they call ``publish_on_commit``, and
when their transaction commits each run they touched is pushed once, with
one query for all of them, however many transitions the transaction held.
"""

import logging
import threading

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from runs.models import Run

log = logging.getLogger(__name__)
# Runs touched by this thread's open transaction (database connections,
# and so transactions, belong to one thread).
_touched = threading.local()


def run_group(run_id: int) -> str:
    """The Channels group name for one run."""
    return f"run-{run_id}"


RUNS_GROUP = "runs"


def user_group(user_id: int) -> str:
    """The Channels group of every live socket of user ``user_id``."""
    return f"user-{user_id}"


SNAPSHOT_FIELDS = ("id", "requested_by", "status", "phase", "waiting_reason", "failure_type", "outcome",
                   "outcome_reason", "final_output", "updated_at")


def run_snapshot(run: Run) -> dict:
    """The live view of a run: ids (run, requesting user), status fields and timestamps (ISO 8601)."""
    return {
        "id": run.pk,
        "requested_by": run.requested_by_id,
        "status": run.status,
        "phase": run.phase,
        "waiting_reason": run.waiting_reason,
        "failure_type": run.failure_type,
        "outcome": run.outcome,
        "outcome_reason": run.outcome_reason,
        "final_output": run.final_output,
        "updated_at": run.updated_at.isoformat() if run.updated_at else None,
    }


def _send(groups: list[str], message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for group in groups:
            async_to_sync(layer.group_send)(group, message)
    except Exception:  # a dead channel layer must not break a run
        log.exception("could not publish %s", message.get("type"))


def publish_run_update(run_id: int) -> None:
    """Send the current snapshot of run ``run_id`` to its group and the list group."""
    _publish({run_id})


def _publish(run_ids: set[int]) -> None:
    """Send the current snapshots of ``run_ids``, read with one query (none without a channel layer)."""
    if not run_ids or get_channel_layer() is None:
        return
    for run in Run.objects.filter(pk__in=run_ids).only(*SNAPSHOT_FIELDS):
        _send([run_group(run.pk), RUNS_GROUP], {"type": "run.update", "run": run_snapshot(run)})


def _flush() -> None:
    run_ids, _touched.run_ids = getattr(_touched, "run_ids", set()), set()
    _publish(run_ids)


def publish_on_commit(run_id: int) -> None:
    """Push run ``run_id``'s snapshot once the current transaction commits (at once outside one).

    Coalesced: every run touched in one transaction is pushed once, by the
    first of the transaction's callbacks to run, with one query for all of
    them. A run touched in a transaction that rolled back is pushed with
    the next commit of the same thread: a spare push of a fresh snapshot.
    """
    if not hasattr(_touched, "run_ids"):
        _touched.run_ids = set()
    _touched.run_ids.add(run_id)
    transaction.on_commit(_flush, robust=True)


def publish_delta(run_id: int, *, kind: str, data: dict) -> None:
    """Send one streaming event (``text_delta`` or ``tool_call_delta``) of run ``run_id``."""
    _send([run_group(run_id)], {"type": "run.delta", "kind": kind, "data": data})


def publish_access_changed(user_ids, *, ended_session: str = "") -> None:
    """Tell every socket of the users ``user_ids`` to check their access again.

    ``ended_session``: the key of a session that was just logged out; its
    sockets close without a check (the session row may not be gone yet).
    """
    message = {"type": "access.changed", "ended_session": ended_session}
    _send([user_group(user_id) for user_id in user_ids], message)
