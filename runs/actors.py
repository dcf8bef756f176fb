"""Dramatiq actors: thin wrappers that load, call the loop, and return."""

import logging

import dramatiq
from django_fsm import ConcurrentTransition

from runs.models import FailureType, Run
from runs.services import transition_run

log = logging.getLogger(__name__)


@dramatiq.actor(max_retries=0, time_limit=60 * 60 * 1000)
def advance_run(run_id: int) -> None:
    """Advance run ``run_id`` (see ``runs.loop.advance``).

    A ``ConcurrentTransition`` means another writer moved the run first;
    this worker stops and leaves the run to it. Any other exception fails
    the run with ``internal_error`` rather than leaving it stuck.
    """
    from runs.loop import advance

    if not Run.objects.filter(pk=run_id).exists():
        log.warning("run %s does not exist; dropping the message", run_id)
        return
    try:
        advance(run_id)
    except ConcurrentTransition:
        log.info("run %s changed under this worker; leaving it", run_id)
    except Exception as exc:
        log.exception("advancing run %s failed", run_id)
        run = Run.objects.get(pk=run_id)
        if not run.is_terminal:
            transition_run(run, "fail", actor="worker", reason="internal error",
                           failure_type=FailureType.INTERNAL_ERROR, error=f"{type(exc).__name__}: {exc}")
