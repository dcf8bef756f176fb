"""Dramatiq actors: thin wrappers that load, hand over or call the runtime, and return."""

import logging

import dramatiq
from django.conf import settings
from django.db import DatabaseError

from runs.base import log_context
from runs.engine.runtime import RETRY_AFTER_DB_ERROR_MS, EngineFull, engine
from runs.models import Run
from runs.wakeups import ADVANCE_ACTOR, QUARANTINE_ACTOR, wake_now

log = logging.getLogger(__name__)
TIME_LIMIT_MS = 5 * 60 * 1000


@dramatiq.actor(actor_name=ADVANCE_ACTOR, max_retries=0, time_limit=TIME_LIMIT_MS)
def advance_run(run_id: int) -> None:
    """Hand run ``run_id`` to this process's engine (``runs.engine.runtime.Engine.submit``).

    Returns once the run is under way, not when its slice ends; blocks
    while the engine has ``RUNS_IN_FLIGHT`` runs in flight (for
    ``SUBMIT_WAIT_S`` at most: then the run goes back to the queue). A run
    whose lease another worker holds, or that waits or ended, is left
    alone; a suspect goes on to the quarantine queue when there is one
    (``TOLLGATE["QUARANTINE_QUEUE"]``). A database error (a restart, a
    failover) looks again in ``RETRY_AFTER_DB_ERROR_MS``.
    """
    _submit(run_id, suspect=False)


def _submit(run_id: int, *, suspect: bool) -> None:
    """``Engine.submit`` of ``run_id`` for an actor; ``suspect``: sent from the quarantine queue, and sent back there."""
    with log_context.bound(run_id):  # its log lines carry the run (runs.base.log_context)
        try:
            held = engine().submit(run_id, quarantine_worker=suspect)
        except EngineFull:
            log.info("engine full; run %s goes back to the queue", run_id)
            wake_now(run_id, delay_ms=RETRY_AFTER_DB_ERROR_MS, suspect=suspect)
            return
        except DatabaseError:
            log.exception("database error taking run %s; trying again in %s ms", run_id, RETRY_AFTER_DB_ERROR_MS)
            wake_now(run_id, delay_ms=RETRY_AFTER_DB_ERROR_MS, suspect=suspect)
            return
        if held is None and not Run.objects.filter(pk=run_id).exists():
            log.warning("run %s does not exist; dropping the message", run_id)


if settings.TOLLGATE["QUARANTINE_QUEUE"]:  # declared only then: a worker consumes every queue declared
    @dramatiq.actor(actor_name=QUARANTINE_ACTOR, queue_name=settings.TOLLGATE["QUARANTINE_QUEUE"], max_retries=0,
                    time_limit=TIME_LIMIT_MS)
    def advance_suspect(run_id: int) -> None:
        """``advance_run`` for a suspect sent to the quarantine queue: advanced here, never sent on again."""
        _submit(run_id, suspect=True)

