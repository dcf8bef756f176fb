"""The demo shop's data: orders and the payment gateway's refund ledger.

This is demo domain data that the demo tools act on, not part of the
runtime. ``GatewayRefund`` stands in for the external payment gateway's own
ledger: one row per idempotency key, so a repeated request is a no-op.
"""

from decimal import Decimal

from django.conf import settings
from django.db import models


class Order(models.Model):
    """A shop order. ``number`` is what customers and the model call it."""

    class Status(models.TextChoices):
        OPEN = "open"
        CANCELLED = "cancelled"

    number = models.PositiveIntegerField(unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="orders")
    total = models.DecimalField(max_digits=10, decimal_places=2)
    shipped = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    refunded = models.DecimalField(max_digits=10, decimal_places=2, default=Decimal("0"))

    class Meta:
        ordering = ["number"]

    def __str__(self):
        return f"order {self.number}"

    @property
    def refundable_amount(self) -> Decimal:
        if self.status == self.Status.CANCELLED:
            return Decimal("0")
        return self.total - self.refunded


class GatewayRefund(models.Model):
    """One refund the payment gateway executed, keyed by idempotency key."""

    idempotency_key = models.CharField(max_length=80, unique=True)
    order_number = models.PositiveIntegerField()
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"refund {self.amount} on order {self.order_number}"
