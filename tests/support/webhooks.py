"""Helpers shared by the webhook tests (the ``receiver`` and ``webhook_settings`` fixtures are in conftest)."""

import time

from runs.webhooks.models import DeliveryStatus, WebhookDelivery
from runs.webhooks.services import create_subscription

# The retry schedule of the ``webhook_settings`` fixture: retries within a test.
FAST_SCHEDULE_S = [0.3, 0.3]


def subscribe(user, receiver, *types):
    """A subscription of ``user`` to the receiver (all event types unless ``types`` are given)."""
    return create_subscription(owner=user, url=receiver.url, event_types=list(types) or None)


def wait_until(predicate, timeout_s: float = 30, what: str = "condition"):
    """Poll ``predicate`` until it returns something true; returns that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_settled(subscription, count: int, timeout_s: float = 30) -> list[WebhookDelivery]:
    """Block until ``count`` deliveries of ``subscription`` exist and none is pending; returns them by id."""
    def settled():
        deliveries = list(WebhookDelivery.objects.filter(subscription=subscription).order_by("id"))
        done = len(deliveries) >= count and all(d.status != DeliveryStatus.PENDING for d in deliveries)
        return deliveries if done else None

    return wait_until(settled, timeout_s, f"{count} settled deliveries")
