"""Subscriptions, deliveries and the outbox between the event log and them (docs/design.md#webhooks)."""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from config.strict_json import StoredJSONDecoder
from runs.base.labels import choice
from runs.models import RunEvent


class EventType(models.TextChoices):
    """What a subscription can ask for; ``runs.webhooks.events`` says which ``RunEvent`` rows map to each."""

    RUN_WAITING = choice("run.waiting")
    RUN_COMPLETED = choice("run.completed")
    RUN_FAILED = choice("run.failed")
    RUN_CANCELLED = choice("run.cancelled")
    INTERRUPT_CREATED = choice("interrupt.created")
    INTERRUPT_RESOLVED = choice("interrupt.resolved")
    TOOL_CALL_UNKNOWN = choice("tool_call.unknown")


class WebhookSubscription(models.Model):
    """An owner's endpoint and the event types it wants.

    The owner receives events of the runs they may see (``runs.access``),
    checked when an event is fanned out and again before each attempt.
    ``secret`` (``whsec_`` + base64 of 32 random bytes) signs every
    delivery; it is made by the server and shown once, in the answer that
    created the subscription. It is kept as it is because signing needs it.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("owner"), on_delete=models.CASCADE,
                              related_name="webhook_subscriptions")
    url = models.URLField(_("URL"), max_length=2000, help_text=_("http(s) endpoint; checked against this server and "
                                                                 "private networks (runs.webhooks.urlguard)."))
    event_types = models.JSONField(_("event types"), default=list,
                                   help_text=_("Event type names, e.g. [\"run.completed\"]."),
                                   decoder=StoredJSONDecoder)
    secret = models.CharField(_("secret"), max_length=100, editable=False)
    active = models.BooleanField(_("active"), default=True,
                                 help_text=_("An inactive subscription gets no new deliveries; "
                                             "its pending ones wait until it is active again."))
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("webhook subscription")
        verbose_name_plural = _("webhook subscriptions")
        ordering = ["id"]

    def __str__(self):
        return f"webhook {self.pk} -> {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = choice("pending")  # not delivered yet: waiting its turn, its next attempt, or being sent
    DELIVERED = choice("delivered")  # the endpoint answered 2xx
    FAILED = choice("failed")  # given up after the whole retry schedule (or the owner may no longer see the run)


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

    subscription = models.ForeignKey(WebhookSubscription, verbose_name=_("subscription"), on_delete=models.CASCADE,
                                     related_name="deliveries")
    event_id = models.PositiveBigIntegerField(_("event id"))
    event_type = models.CharField(_("event type"), max_length=32, choices=EventType.choices)
    run_id = models.PositiveBigIntegerField(_("run id"))
    event_seq = models.PositiveIntegerField(_("event seq"))
    payload = models.JSONField(_("payload"), decoder=StoredJSONDecoder)
    status = models.CharField(_("status"), max_length=16, choices=DeliveryStatus.choices,
                              default=DeliveryStatus.PENDING)
    attempt_count = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt at"))
    claimed_until = models.DateTimeField(_("claimed until"), null=True, blank=True)
    claim_token = models.PositiveBigIntegerField(_("claim token"), default=0)
    last_attempt_at = models.DateTimeField(_("last attempt at"), null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(_("last status code"), null=True, blank=True)
    last_response = models.TextField(_("last response"), blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("webhook delivery")
        verbose_name_plural = _("webhook deliveries")
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["subscription", "event_id"], name="one_delivery_per_event")]
        indexes = [
            models.Index(fields=["subscription", "run_id", "status", "event_seq"], name="delivery_chain"),
            models.Index(fields=["status", "next_attempt_at"], name="delivery_due"),
            # Claims not yet released: the owner's in-flight count (delivery._in_flight) reads only these.
            models.Index(fields=["subscription", "claimed_until"], name="delivery_claimed",
                         condition=models.Q(claimed_until__isnull=False)),
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

    event = models.OneToOneField(RunEvent, verbose_name=_("event"), on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("outbox entry")
        verbose_name_plural = _("outbox entries")
        ordering = ["id"]

    def __str__(self):
        return f"outbox entry for event {self.event_id}"
