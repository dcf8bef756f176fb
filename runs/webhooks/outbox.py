"""From the event log to deliveries: the outbox, written with the event, and its fan-out.

``record_event`` is connected to ``RunEvent``'s post-save signal, so it
runs inside the transaction that appends the event
(``runs.services.append_event``): the outbox entry commits or rolls back
with the event itself, and an event committed is never missed, whenever
the process dies. (A cursor over event ids would not do: ids are taken
when rows are inserted, not when they commit, so a reader could pass an
id whose transaction commits later.) Events appended while no subscription
is active are not recorded at all; whether one is, is asked once per
transaction (``_subscriptions_active``), not once per event.

``dispatch`` turns entries into deliveries and deletes them in one
transaction; entries another dispatcher holds are skipped
(``SKIP LOCKED``), so any number may run. It is woken after each commit
that recorded an entry, and run by the sweeper as a backstop.
"""

import threading

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver
from django.utils import timezone

from runs.access import RunAccess
from runs.base import selects
from runs.models import RunEvent
from runs.webhooks.events import webhook_body, webhook_type
from runs.webhooks.models import DeliveryStatus, OutboxEntry, WebhookDelivery, WebhookSubscription
from runs.webhooks.nudges import wake_chain, wake_dispatcher

DISPATCH_BATCH = 500


@receiver(post_save, sender=RunEvent, dispatch_uid="webhooks-outbox")
def record_event(sender, instance: RunEvent, created: bool, raw: bool = False, **kwargs) -> None:
    """Put a new event that maps to a webhook type into the outbox (same transaction), and wake the dispatcher on commit."""
    if raw or not created or webhook_type(instance) is None:
        return
    if not _subscriptions_active():
        return
    OutboxEntry.objects.create(event=instance)
    transaction.on_commit(wake_dispatcher, robust=True)


class _Asked:
    """A do-nothing commit hook that marks the transaction in which ``_subscriptions_active`` last asked."""

    def __call__(self) -> None:
        pass


_asked = threading.local()  # (marker, its place in the connection's commit hooks, the answer)


def _subscriptions_active() -> bool:
    """Whether any subscription is active: asked once per transaction of this thread (every time outside one).

    A transaction's events commit together, so they are recorded or not
    together: the first event of a transaction asks the database, the
    others reuse its answer. The answer is tied to a no-op commit hook
    (``transaction.on_commit``): Django drops a transaction's hooks when it
    commits or rolls back (and a savepoint's when that rolls back), so once
    the hook is gone from its place in ``connection.run_on_commit`` the
    answer is stale and the database is asked again.
    """
    connection = transaction.get_connection()
    hooks = connection.run_on_commit
    known = getattr(_asked, "known", None)
    if connection.in_atomic_block and known is not None:
        marker, place, answer = known
        if place < len(hooks) and hooks[place][1] is marker:
            return answer
    answer = selects.exists(WebhookSubscription, {"active": True})  # built once: no queryset per transaction
    if connection.in_atomic_block:
        marker = _Asked()
        transaction.on_commit(marker)
        _asked.known = (marker, len(connection.run_on_commit) - 1, answer)
    return answer


def dispatch(*, limit: int = DISPATCH_BATCH) -> int:
    """Fan up to ``limit`` outbox entries out into deliveries; returns how many entries were handled.

    Each event goes to every active subscription (of an active owner) that
    asks for its type and whose owner may see the run. After commit, every
    chain of the runs handled that has a pending delivery is woken: those
    that got one, and those whose head waited for these entries.
    """
    with transaction.atomic():
        entries = list(OutboxEntry.objects.select_for_update(skip_locked=True, of=("self",))
                       .select_related("event__run__agent", "event__run__requested_by").order_by("id")[:limit])
        if not entries:
            return 0
        subscriptions = list(WebhookSubscription.objects.filter(active=True, owner__is_active=True)
                             .select_related("owner"))
        access = {s.pk: RunAccess.of(s.owner) for s in subscriptions}  # who sees which runs (runs.access)
        now = timezone.now()
        deliveries = []
        for entry in entries:
            event, kind = entry.event, webhook_type(entry.event)
            targets = [s for s in subscriptions
                       if kind in s.event_types and access[s.pk].sees(event.run.requested_by_id)]
            if targets:
                body = webhook_body(event, kind)
                deliveries += [WebhookDelivery(subscription=s, event_id=event.pk, event_type=kind, run_id=event.run_id,
                                               event_seq=event.seq, payload=body, next_attempt_at=now)
                               for s in targets]
        WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
        OutboxEntry.objects.filter(pk__in=[entry.pk for entry in entries]).delete()
        run_ids = sorted({entry.event.run_id for entry in entries})
        transaction.on_commit(lambda: _wake_pending_chains(run_ids), robust=True)
    return len(entries)


def _wake_pending_chains(run_ids: list[int]) -> None:
    pending = (WebhookDelivery.objects.filter(run_id__in=run_ids, status=DeliveryStatus.PENDING).order_by()
               .values_list("subscription_id", "run_id").distinct())
    for subscription_id, run_id in pending:
        wake_chain(subscription_id, run_id)
