"""REST representations of subscriptions and deliveries, and the bodies that change them.

The secret is in ``WebhookSubscriptionCreatedSerializer`` only: the answer
to the request that created the subscription. No other representation has
a field for it.
"""

from rest_framework import serializers

from config.api import StrictSerializer
from runs.webhooks.models import EventType, WebhookDelivery, WebhookSubscription


class WebhookSubscriptionSerializer(serializers.ModelSerializer):
    """A subscription as its owner sees it (never its secret)."""

    class Meta:
        model = WebhookSubscription
        fields = ["id", "url", "event_types", "active", "created_at", "updated_at"]
        read_only_fields = fields


class WebhookSubscriptionCreatedSerializer(WebhookSubscriptionSerializer):
    """The answer to creating a subscription: with the signing ``secret``, shown this once."""

    class Meta(WebhookSubscriptionSerializer.Meta):
        fields = [*WebhookSubscriptionSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class WebhookSubscriptionWriteSerializer(StrictSerializer):
    """Body of creating (all fields but ``url`` optional) or changing (any fields) a subscription."""

    url = serializers.CharField(max_length=2000, help_text="https:// endpoint (checked: no private or own addresses).")
    event_types = serializers.ListField(
        child=serializers.ChoiceField(choices=EventType.choices), allow_empty=False, max_length=len(EventType.values),
        required=False, help_text="Event types to receive; omitted at creation: all of them.")
    active = serializers.BooleanField(required=False)


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """One event sent (or to be sent) to a subscription: the body, and how the last attempt went."""

    run = serializers.IntegerField(source="run_id", read_only=True)
    webhook_id = serializers.CharField(read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = ["id", "subscription", "webhook_id", "event_id", "event_type", "run", "payload", "status",
                  "attempt_count", "next_attempt_at", "last_attempt_at", "last_status_code", "last_response",
                  "last_error", "delivered_at", "created_at"]
        read_only_fields = fields


class RedeliverSerializer(StrictSerializer):
    """Body of ``POST /api/webhooks/deliveries/{id}/redeliver/``: nothing (any field is refused)."""
