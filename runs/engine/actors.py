"""Dramatiq actors: thin wrappers that load, hand over or call the runtime, and return."""

import logging

import dramatiq
from django.db import DatabaseError

from runs.base import log_context
from runs.engine.runtime import RETRY_AFTER_DB_ERROR_MS, EngineFull, engine
from runs.models import Run
from runs.wakeups import ADVANCE_ACTOR, wake_now

log = logging.getLogger(__name__)


@dramatiq.actor(actor_name=ADVANCE_ACTOR, max_retries=0, time_limit=5 * 60 * 1000)
def advance_run(run_id: int) -> None:
    """Hand run ``run_id`` to this process's engine (``runs.engine.runtime.Engine.submit``).

    Returns once the run is under way, not when its slice ends; blocks
    while the engine has ``RUNS_IN_FLIGHT`` runs in flight (for
    ``SUBMIT_WAIT_S`` at most: then the run goes back to the queue). A run
    whose lease another worker holds, or that waits or ended, is left
    alone. A database error (a restart, a failover) looks again in
    ``RETRY_AFTER_DB_ERROR_MS``.
    """
    with log_context.bound(run_id):  # its log lines carry the run (runs.base.log_context)
        try:
            held = engine().submit(run_id)
        except EngineFull:
            log.info("engine full; run %s goes back to the queue", run_id)
            wake_now(run_id, delay_ms=RETRY_AFTER_DB_ERROR_MS)
            return
        except DatabaseError:
            log.exception("database error taking run %s; trying again in %s ms", run_id, RETRY_AFTER_DB_ERROR_MS)
            wake_now(run_id, delay_ms=RETRY_AFTER_DB_ERROR_MS)
            return
        if held is None and not Run.objects.filter(pk=run_id).exists():
            log.warning("run %s does not exist; dropping the message", run_id)

