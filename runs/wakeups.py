"""Wake a worker for a run, by the advance actor's name (the kernel never imports the engine).

The database is the truth; a wake-up only tells some worker to look. A
lost wake-up is harmless (the sweeper re-sends it), a duplicate one is a
cheap no-op (the run's lease decides who advances it). Messages name the
actor ``advance_run`` (``runs.engine.actors``) and its queue; Dramatiq
delivers them to whichever process declared that actor. A suspect
forwarded to the quarantine queue (``TOLLGATE["QUARANTINE_QUEUE"]``, when
set) names ``advance_suspect`` instead.
"""

import logging

import dramatiq
from django.conf import settings
from django.db import transaction
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import dq_name

log = logging.getLogger(__name__)

ADVANCE_ACTOR = "advance_run"
ADVANCE_QUEUE = "default"
QUARANTINE_ACTOR = "advance_suspect"


def quarantine_queue() -> str:
    """The queue of suspects (``TOLLGATE["QUARANTINE_QUEUE"]``); "" when every worker quarantines its own."""
    return settings.TOLLGATE["QUARANTINE_QUEUE"]


def _message(run_id: int, queue: str, actor: str) -> dramatiq.Message:
    return dramatiq.Message(queue_name=queue, actor_name=actor, args=(run_id,), kwargs={}, options={})


def wake_now(run_id: int, *, delay_ms: int | None = None, suspect: bool = False) -> None:
    """Enqueue a wake-up for ``run_id`` at once (after ``delay_ms`` milliseconds if given); with ``suspect``,
    on the quarantine queue (``quarantine_queue``, which must be set then) for its own workers.

    For callers outside a transaction, e.g. a worker handing a run back to
    the queue at the end of its slice. Raises the broker's error if it is down.
    """
    queue, actor = (quarantine_queue(), QUARANTINE_ACTOR) if suspect else (ADVANCE_QUEUE, ADVANCE_ACTOR)
    broker = dramatiq.get_broker()
    broker.declare_queue(queue)  # idempotent; a process that declared no actor may still send
    broker.enqueue(_message(run_id, queue, actor), delay=delay_ms)


def wake_on_commit(run_id: int, *, delay_ms: int | None = None, suspect: bool = False) -> None:
    """Enqueue a wake-up for ``run_id`` once the current transaction commits (never before, never on rollback),
    ``delay_ms`` milliseconds later if given, on the quarantine queue with ``suspect`` (``wake_now``). Never
    raises: a broker error is logged (``robust``), and the sweeper re-sends lost wake-ups."""
    transaction.on_commit(lambda: wake_now(run_id, delay_ms=delay_ms, suspect=suspect), robust=True)


def _run_id(data: bytes) -> int | None:
    try:
        message = dramatiq.Message.decode(data)
    except Exception:  # not ours, or not readable: it cannot stand for a run
        return None
    if message.actor_name not in (ADVANCE_ACTOR, QUARANTINE_ACTOR) or not message.args:
        return None
    return message.args[0]


def _encoded_messages(broker) -> list[bytes] | None:
    """Every message of the advance and quarantine queues (and their delay queues) that no consumer has
    fetched yet.

    Fetched ones are left out on purpose: a consumer that died holds its
    fetched messages until the broker's own maintenance returns them, so
    such a message is no sign that the run will be advanced.
    """
    names = [name for queue in (ADVANCE_QUEUE, quarantine_queue()) if queue for name in (queue, dq_name(queue))]
    if isinstance(broker, RedisBroker):
        # Redis broker layout: "<ns>:<queue>" lists the ids not fetched yet; "<ns>:<queue>.msgs" maps id -> data.
        found = []
        for name in names:
            ids = broker.client.lrange(f"{broker.namespace}:{name}", 0, -1)
            for start in range(0, len(ids), 1000):
                found += [data for data in broker.client.hmget(f"{broker.namespace}:{name}.msgs",
                                                               ids[start:start + 1000]) if data]
        return found
    if isinstance(broker, StubBroker):
        return [data for name in names if name in broker.queues for data in list(broker.queues[name].queue)]
    return None


def runs_with_pending_wakeups() -> set[int] | None:
    """Ids of runs whose wake-up waits in the broker, not yet fetched; None when this broker cannot be asked.

    Reads the whole advance queue once (O(backlog)): the sweeper calls it
    once per pass, so a run that merely waits its turn behind a long queue
    is not taken for one whose message was lost.
    """
    try:
        messages = _encoded_messages(dramatiq.get_broker())
    except Exception:  # a broker that cannot be asked must not stop the sweeper
        log.warning("could not read the advance queue", exc_info=True)
        return None
    if messages is None:
        return None
    return {run_id for run_id in map(_run_id, messages) if run_id is not None}
