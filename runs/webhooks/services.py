"""Subscribing, changing a subscription, sending a delivery again, and the sweeper's backstop.

The API and the admin call these; errors are the ``runs.base.errors`` family
(``InvalidInput``/``UnsafeURL`` 400, ``Conflict`` 409).
"""

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from runs.base.errors import Conflict, InvalidInput
from runs.webhooks.delivery import new_secret
from runs.webhooks.models import DeliveryStatus, EventType, WebhookDelivery, WebhookSubscription
from runs.webhooks.nudges import wake_chain
from runs.webhooks.outbox import dispatch
from runs.webhooks.urlguard import check_url

SWEEP_MAX_WAKES = 500


def _checked_event_types(event_types) -> list[str]:
    """``event_types`` as a sorted list of known names; ``InvalidInput`` for an empty list or an unknown name."""
    unknown = sorted(set(event_types) - set(EventType.values))
    if unknown:
        raise InvalidInput.for_fields({"event_types": f"Unknown event type(s): {', '.join(unknown)}. "
                                                      f"Known: {', '.join(EventType.values)}."})
    if not event_types:
        raise InvalidInput.for_fields({"event_types": "Name at least one event type."})
    return sorted(set(event_types))


def create_subscription(*, owner, url: str, event_types: list[str] | None = None,
                        active: bool = True) -> WebhookSubscription:
    """Subscribe ``owner``'s endpoint ``url`` to ``event_types`` (None: every type).

    The returned subscription carries its new ``secret``: show it to the
    owner now, it is never shown again. Raises ``UnsafeURL`` (400) for a URL
    the guard refuses (``runs.webhooks.urlguard``) and ``InvalidInput``
    (400) for unknown event types or when the owner already has
    ``TOLLGATE["WEBHOOK_MAX_SUBSCRIPTIONS_PER_USER"]`` subscriptions.
    """
    types = _checked_event_types(EventType.values if event_types is None else event_types)
    check_url(url)
    limit = settings.TOLLGATE["WEBHOOK_MAX_SUBSCRIPTIONS_PER_USER"]
    with transaction.atomic():
        list(get_user_model().objects.select_for_update().filter(pk=owner.pk).values_list("pk"))  # one at a time
        if WebhookSubscription.objects.filter(owner=owner).count() >= limit:
            raise InvalidInput(f"You have {limit} webhook subscriptions, the most allowed; delete one first.")
        return WebhookSubscription.objects.create(owner=owner, url=url, event_types=types, active=active,
                                                  secret=new_secret())


def update_subscription(subscription: WebhookSubscription, *, url: str | None = None,
                        event_types: list[str] | None = None, active: bool | None = None) -> WebhookSubscription:
    """Change the given fields of ``subscription`` (None: unchanged); the URL is checked again. Errors as ``create_subscription``."""
    changed = ["updated_at"]
    if event_types is not None:
        subscription.event_types = _checked_event_types(event_types)
        changed.append("event_types")
    if url is not None:
        check_url(url)
        subscription.url = url
        changed.append("url")
    if active is not None:
        subscription.active = active
        changed.append("active")
    subscription.save(update_fields=changed)
    return subscription


def redeliver(delivery: WebhookDelivery) -> WebhookDelivery:
    """Send ``delivery`` again, from the start of the retry schedule, in its place in the run's order.

    Works for delivered, failed and pending deliveries (a pending one is
    sent now instead of at its next attempt). Raises ``Conflict`` (409)
    while an attempt is under way or when the subscription is inactive.
    """
    now = timezone.now()
    subscription = delivery.subscription
    if not subscription.active:
        raise Conflict(_("The subscription is inactive; activate it before sending deliveries again."))
    with transaction.atomic():
        reset = (WebhookDelivery.objects.filter(pk=delivery.pk)
                 .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
                 .update(status=DeliveryStatus.PENDING, attempt_count=0, next_attempt_at=now, claimed_until=None,
                         delivered_at=None, updated_at=now))
        if not reset:
            raise Conflict(_("Delivery %(delivery)s is being sent right now; try again when the attempt ends.")
                           % {"delivery": delivery.pk})
        transaction.on_commit(lambda: wake_chain(delivery.subscription_id, delivery.run_id), robust=True)
    delivery.refresh_from_db()
    return delivery


def sweep_webhooks(*, now=None, limit: int = SWEEP_MAX_WAKES) -> dict:
    """The backstop, run with every sweeper pass: nothing the broker lost stays unsent.

    Fans out what is left in the outbox, then wakes (at most ``limit``)
    chains whose head has been due for longer than
    ``TOLLGATE["QUEUED_GRACE_S"]`` and is not claimed, or whose claim
    expired (its worker died). Returns ``{"webhook_events": n,
    "webhook_chains_woken": n}``.
    """
    handled = dispatch()
    now = now or timezone.now()
    earlier = WebhookDelivery.objects.filter(subscription_id=OuterRef("subscription_id"), run_id=OuterRef("run_id"),
                                             status=DeliveryStatus.PENDING, event_seq__lt=OuterRef("event_seq"))
    stale_heads = (
        WebhookDelivery.objects
        .filter(status=DeliveryStatus.PENDING, subscription__active=True, subscription__owner__is_active=True,
                next_attempt_at__lte=now - timedelta(seconds=settings.TOLLGATE["QUEUED_GRACE_S"]))
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .exclude(Exists(earlier))
        .order_by().values_list("subscription_id", "run_id").distinct()[:limit]
    )
    chains = list(stale_heads)
    for subscription_id, run_id in chains:
        wake_chain(subscription_id, run_id)
    return {"webhook_events": handled, "webhook_chains_woken": len(chains)}
