"""Dramatiq actors of the webhooks app: thin wrappers, woken by name (``runs.webhooks.nudges``).

Both may run any number of times for the same work: the outbox rows are
taken with ``SKIP LOCKED`` and a delivery only by claiming it.
"""

import dramatiq

from runs.webhooks.delivery import deliver_chain
from runs.webhooks.nudges import DELIVER_ACTOR, DISPATCH_ACTOR, QUEUE, wake_dispatcher
from runs.webhooks.outbox import DISPATCH_BATCH, dispatch


@dramatiq.actor(actor_name=DISPATCH_ACTOR, queue_name=QUEUE, max_retries=0, time_limit=10 * 60 * 1000)
def dispatch_events() -> None:
    """Fan the outbox out into deliveries (``outbox.dispatch``); a full batch wakes another round."""
    if dispatch() >= DISPATCH_BATCH:
        wake_dispatcher()


@dramatiq.actor(actor_name=DELIVER_ACTOR, queue_name=QUEUE, max_retries=0, time_limit=30 * 60 * 1000)
def deliver_run_events(subscription_id: int, run_id: int) -> None:
    """Send one run's due deliveries to one subscription, in order (``delivery.deliver_chain``)."""
    deliver_chain(subscription_id, run_id)
