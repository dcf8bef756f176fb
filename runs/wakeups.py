"""Wake a worker for a run, by the advance actor's name (the kernel never imports the engine).

The database is the truth; a wake-up only tells some worker to look. A
lost wake-up is harmless (the sweeper re-sends it), a duplicate one is a
cheap no-op (the run's lease decides who advances it). Messages name the
actor ``advance_run`` (``runs.engine.actors``) and its queue; Dramatiq
delivers them to whichever process declared that actor.
"""

import dramatiq
from django.db import transaction

ADVANCE_ACTOR = "advance_run"
ADVANCE_QUEUE = "default"


def _message(run_id: int) -> dramatiq.Message:
    return dramatiq.Message(queue_name=ADVANCE_QUEUE, actor_name=ADVANCE_ACTOR, args=(run_id,), kwargs={},
                            options={})


def wake_now(run_id: int, *, delay_ms: int | None = None) -> None:
    """Enqueue a wake-up for ``run_id`` at once (after ``delay_ms`` milliseconds if given).

    For callers outside a transaction, e.g. a worker handing a run back to
    the queue at the end of its slice. Raises the broker's error if it is down.
    """
    broker = dramatiq.get_broker()
    broker.declare_queue(ADVANCE_QUEUE)  # idempotent; a process that declared no actor may still send
    broker.enqueue(_message(run_id), delay=delay_ms)


def wake_on_commit(run_id: int, *, delay_ms: int | None = None) -> None:
    """Enqueue a wake-up for ``run_id`` once the current transaction commits (never before, never on rollback).

    ``delay_ms``: deliver it that many milliseconds later.

    A broker that is down must not fail the caller's request: the error is
    logged (``robust``) and the sweeper re-sends lost wake-ups.
    """
    transaction.on_commit(lambda: wake_now(run_id, delay_ms=delay_ms), robust=True)
