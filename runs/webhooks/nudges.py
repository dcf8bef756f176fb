"""Wake the webhook actors by name (``runs.webhooks.actors`` declares them); best effort.

A lost message loses nothing: the outbox and the deliveries are rows, and
the sweeper (``services.sweep_webhooks``) wakes whatever waited too long.
So a broker that cannot be reached is logged, never raised.
"""

import logging

import dramatiq

log = logging.getLogger(__name__)

QUEUE = "webhooks"
DISPATCH_ACTOR = "webhooks_dispatch"
DELIVER_ACTOR = "webhooks_deliver"


def _send(actor_name: str, args: tuple, delay_s: float | None = None) -> None:
    message = dramatiq.Message(queue_name=QUEUE, actor_name=actor_name, args=args, kwargs={}, options={})
    try:
        broker = dramatiq.get_broker()
        broker.declare_queue(QUEUE)  # idempotent; a process that declared no actor may still send
        broker.enqueue(message, delay=None if delay_s is None else max(0, int(delay_s * 1000)))
    except Exception:
        log.warning("could not send %s%r; the sweeper will catch up", actor_name, args, exc_info=True)


def wake_dispatcher() -> None:
    """Ask a worker to fan the outbox out into deliveries (``outbox.dispatch``)."""
    _send(DISPATCH_ACTOR, ())


def wake_chain(subscription_id: int, run_id: int, *, delay_s: float | None = None) -> None:
    """Ask a worker to send the next deliveries of one run to one subscription, after ``delay_s`` seconds if given."""
    _send(DELIVER_ACTOR, (subscription_id, run_id), delay_s)
