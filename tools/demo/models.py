"""The demo shop's orders, which the demo tools act on (not part of the runtime).

Refunds live in the payment gateway's own ledger (``tools/demo/gateway_server.py``),
which keeps every refund, as a payment provider would; an order counts those
made since its ``refunds_since`` (``manage.py demo`` sets it, so a reset
order is refundable in full again without emptying anyone's ledger).
The table was ``tools_order`` until the demo became an app of its own
(``tools.demo.migrations.0001_initial`` took it over, rows included).
"""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.base.labels import choice


# The order the "refund-order" agent refunds, whose total (120.00) has room for one of its refunds:
# the demo's contested target. "refund-next-order" leaves it alone.
CONTESTED_ORDER = 123


class Order(models.Model):
    """A shop order. ``number`` is what customers and the model call it."""

    class Status(models.TextChoices):
        OPEN = choice("open")
        CANCELLED = choice("cancelled")

    number = models.PositiveIntegerField(_("number"), unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("owner"), on_delete=models.CASCADE,
                              related_name="orders")
    total = models.DecimalField(_("total"), max_digits=10, decimal_places=2)
    shipped = models.BooleanField(_("shipped"), default=False)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.OPEN)
    refunds_since = models.DateTimeField(
        _("refunds counted since"), null=True, blank=True,
        help_text=_("Refunds made before this time do not count against the order (set when the demo is reset)."))
    # Claimed by one run with a conditional UPDATE, so two runs in flight at once never pick the same order.
    held_for_run = models.PositiveIntegerField(
        _("held for run"), null=True, blank=True,
        help_text=_("The run that found this order for a refund (find_refundable_order); no other run in "
                    "progress picks it."))

    class Meta:
        # Named, so that importing this module with the demo app left out (settings without
        # ``tools.demo``) cannot make the model part of the enclosing ``tools`` app.
        app_label = "demo"
        verbose_name = _("order")
        verbose_name_plural = _("orders")
        ordering = ["number"]

    def __str__(self):
        return f"order {self.number}"
