"""Django admin for the demo shop's orders (editable demo data).

Refunds live in the payment gateway's own ledger (a separate service), not here.
"""

from django.contrib import admin

from tools.demo.models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """The demo shop's orders (what the demo tools query, refund and cancel)."""

    list_display = ("number", "owner", "total", "shipped", "status")
    list_filter = ("status", "shipped")
    search_fields = ("=number", "owner__username")
    list_select_related = ("owner",)
    raw_id_fields = ("owner",)
