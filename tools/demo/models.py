"""The demo shop's orders, which the demo tools act on (not part of the runtime).

Refunds live in the payment gateway's own ledger (``tools/demo/gateway_server.py``).
The table was ``tools_order`` until the demo became an app of its own
(``tools.demo.migrations.0001_initial`` took it over, rows included).
"""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.labels import choice


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

    class Meta:
        verbose_name = _("order")
        verbose_name_plural = _("orders")
        ordering = ["number"]

    def __str__(self):
        return f"order {self.number}"
