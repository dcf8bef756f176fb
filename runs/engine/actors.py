"""Dramatiq actors: thin wrappers that load, call the runtime, and return."""

import logging

import dramatiq
from django.db import DatabaseError
from django.utils import timezone
from django_fsm import ConcurrentTransition

from approvals.notifications import NOTIFY_ACTOR, send_queued
from runs.lease import LeaseLost
from runs.models import FailureType, Run
from runs.engine.lifecycle import end_run
from runs.engine.loop import advance
from runs.wakeups import ADVANCE_ACTOR, wake_now

log = logging.getLogger(__name__)
RETRY_AFTER_DB_ERROR_MS = 2000


@dramatiq.actor(actor_name=ADVANCE_ACTOR, max_retries=0, time_limit=60 * 60 * 1000)
def advance_run(run_id: int) -> None:
    """Advance run ``run_id`` (see ``runs.engine.loop.advance``).

    ``LeaseLost`` or ``ConcurrentTransition`` mean another worker or a
    person moved the run first: this worker stops and leaves it. Any other
    exception fails the run with ``internal_error`` rather than leaving it
    stuck.
    """
    try:
        if advance(run_id) is None and not Run.objects.filter(pk=run_id).exists():  # asked only when not taken
            log.warning("run %s does not exist; dropping the message", run_id)
    except (LeaseLost, ConcurrentTransition) as exc:
        log.info("run %s changed under this worker (%s); leaving it", run_id, exc)
    except DatabaseError:
        # Likely transient (a restart, a failover): look again shortly rather
        # than after the sweeper's grace period. A step cut off here is
        # counted by the next takeover's crash streak, so this stays bounded.
        log.exception("database error advancing run %s; trying again in %s ms", run_id, RETRY_AFTER_DB_ERROR_MS)
        wake_now(run_id, delay_ms=RETRY_AFTER_DB_ERROR_MS)
    except Exception as exc:
        log.exception("advancing run %s failed", run_id)
        _fail_unless_taken_over(run_id, exc)


def _fail_unless_taken_over(run_id: int, exc: Exception) -> None:
    """Fail the run with ``internal_error``, unless another worker holds its lease by now."""
    run = Run.objects.get(pk=run_id)
    if run.is_terminal or (run.lease_expires_at is not None and run.lease_expires_at > timezone.now()):
        return
    end_run(run.fail, actor="worker", reason="internal error",
            failure_type=FailureType.INTERNAL_ERROR,
            error=f"An internal error stopped the run ({type(exc).__name__}); operators find it in the log.")


@dramatiq.actor(actor_name=NOTIFY_ACTOR, max_retries=0, time_limit=5 * 60 * 1000)
def send_notification(kind: str, interrupt_id: int) -> None:
    """Send one email notification about item ``interrupt_id`` (``approvals.notifications.send_queued``)."""
    send_queued(kind, interrupt_id)
