"""Django admin for webhooks: subscriptions (switch on/off, delete) and deliveries with the endpoints' answers.

Subscriptions are made through the API (its answer is the only place the
secret is shown); here only ``active`` can be changed, and the secret is
never displayed. Deliveries are view-only; "Send selected deliveries
again" calls ``services.redeliver``.
"""

from django.contrib import admin, messages
from django.utils.translation import gettext as _, gettext_lazy, ngettext

from runs.admin.base import ReadOnlyAdminMixin, truncated
from runs.base.errors import TollgateError
from runs.webhooks.models import WebhookDelivery, WebhookSubscription
from runs.webhooks.services import redeliver, update_subscription


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    """Subscriptions: everything read-only but ``active``; no secret, no adding here."""

    list_display = ("id", "owner", "url", "event_types", "active", "created_at")
    list_filter = ("active",)
    search_fields = ("=id", "url", "owner__username")
    list_select_related = ("owner",)
    fields = ("owner", "url", "event_types", "active", "created_at", "updated_at")
    readonly_fields = ("owner", "url", "event_types", "created_at", "updated_at")

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        update_subscription(obj, active=form.cleaned_data["active"])


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Deliveries, view-only, with the last answer of the endpoint; send them again with the action."""

    list_display = ("id", "subscription", "event_type", "run_id", "status", "attempt_count", "last_status_code",
                    "response_start", "next_attempt_at", "created_at")
    list_filter = ("status", "event_type")
    search_fields = ("=id", "=run_id", "=event_id", "subscription__url", "last_response", "last_error")
    list_select_related = ("subscription",)
    date_hierarchy = "created_at"
    actions = ["redeliver_selected"]

    @admin.display(description=gettext_lazy("answer"))
    def response_start(self, delivery: WebhookDelivery) -> str:
        return truncated(delivery.last_response or delivery.last_error, 60)

    @admin.action(description=gettext_lazy("Send selected deliveries again"))
    def redeliver_selected(self, request, queryset):
        """``services.redeliver`` for each selected delivery; refusals are reported per delivery."""
        done = 0
        for delivery in queryset.select_related("subscription").order_by("pk"):
            try:
                redeliver(delivery)
            except TollgateError as exc:
                self.message_user(request, _("Delivery %(delivery)s was not queued: %(error)s")
                                  % {"delivery": delivery.pk, "error": exc.message}, level=messages.WARNING)
            else:
                done += 1
        if done:
            self.message_user(request, ngettext("Queued %(count)d delivery again.", "Queued %(count)d deliveries again.",
                                                done) % {"count": done}, level=messages.SUCCESS)
