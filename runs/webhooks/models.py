"""Subscriptions, deliveries and the outbox between the event log and them (docs/design.md#webhooks)."""

from django.conf import settings
from django.db import models

from runs.models import RunEvent


class EventType(models.TextChoices):
    """What a subscription can ask for; ``runs.webhooks.events`` says which ``RunEvent`` rows map to each."""

    RUN_WAITING = "run.waiting"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    INTERRUPT_CREATED = "interrupt.created"
    INTERRUPT_RESOLVED = "interrupt.resolved"
    TOOL_CALL_UNKNOWN = "tool_call.unknown"


class WebhookSubscription(models.Model):
    """An owner's endpoint and the event types it wants.

    The owner receives events of the runs they may see (``runs.access``),
    checked when an event is fanned out and again before each attempt.
    ``secret`` (``whsec_`` + base64 of 32 random bytes) signs every
    delivery; it is made by the server and shown once, in the answer that
    created the subscription. It is kept as it is because signing needs it.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="webhook_subscriptions")
    url = models.URLField(max_length=2000, help_text="http(s) endpoint; checked against this server and "
                                                     "private networks (runs.webhooks.urlguard).")
    event_types = models.JSONField(default=list, help_text="Event type names, e.g. [\"run.completed\"].")
    secret = models.CharField(max_length=100, editable=False)
    active = models.BooleanField(default=True, help_text="An inactive subscription gets no new deliveries; "
                                                         "its pending ones wait until it is active again.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"webhook {self.pk} -> {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # not delivered yet: waiting its turn, its next attempt, or being sent
    DELIVERED = "delivered"  # the endpoint answered 2xx
    FAILED = "failed"  # given up after the whole retry schedule (or the owner may no longer see the run)


class WebhookDelivery(models.Model):
    """One event for one subscription, and how sending it went.

    ``event_id``/``run_id`` name the ``RunEvent`` and run (plain numbers:
    the record outlives a deleted run); ``event_seq`` orders a run's
    deliveries. ``payload`` is the JSON body sent. An attempt claims the row
    (``claim_token`` grows by one, ``claimed_until`` bounds the claim) and
    writes its result only while the token is still its own.
    ``last_response`` keeps the start of the endpoint's answer,
    ``last_error`` what went wrong before an answer (timeout, refused
    address, ...).
    """

    subscription = models.ForeignKey(WebhookSubscription, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.PositiveBigIntegerField()
    event_type = models.CharField(max_length=32, choices=EventType.choices)
    run_id = models.PositiveBigIntegerField()
    event_seq = models.PositiveIntegerField()
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempt_count = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_until = models.DateTimeField(null=True, blank=True)
    claim_token = models.PositiveBigIntegerField(default=0)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_response = models.TextField(blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["subscription", "event_id"], name="one_delivery_per_event")]
        indexes = [
            models.Index(fields=["subscription", "run_id", "status", "event_seq"], name="delivery_chain"),
            models.Index(fields=["status", "next_attempt_at"], name="delivery_due"),
        ]

    def __str__(self):
        return f"delivery {self.pk} ({self.event_type}, {self.status})"

    @property
    def webhook_id(self) -> str:
        """The ``webhook-id`` header: the same for every attempt, so a receiver can drop repeats."""
        return f"evt_{self.event_id}"


class OutboxEntry(models.Model):
    """An event that maps to a webhook type and was not fanned out into deliveries yet.

    Written in the transaction that appends the event; deleted in the one
    that creates its deliveries (``runs.webhooks.outbox.dispatch``).
    """

    event = models.OneToOneField(RunEvent, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "outbox entries"

    def __str__(self):
        return f"outbox entry for event {self.event_id}"
