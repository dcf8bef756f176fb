"""Dramatiq actors of the approvals app: thin wrappers, sent by name (``approvals.notifications``).

Declared by ``approvals.apps`` for every process, so the run worker that
consumes ``NOTIFY_QUEUE`` finds it; the name and queue are those the
messages already queued carry.
"""

import dramatiq

from approvals.notifications import NOTIFY_ACTOR, NOTIFY_QUEUE, send_queued


@dramatiq.actor(actor_name=NOTIFY_ACTOR, queue_name=NOTIFY_QUEUE, max_retries=0, time_limit=5 * 60 * 1000)
def send_notification(kind: str, interrupt_id: int) -> None:
    """Send one email notification about item ``interrupt_id`` (``approvals.notifications.send_queued``)."""
    send_queued(kind, interrupt_id)
