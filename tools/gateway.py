"""Client of the demo payment gateway, which deduplicates by idempotency key.

The gateway's ledger is ``tools.models.GatewayRefund``: a repeated request
with a key it has seen returns the first refund instead of paying twice,
as real payment APIs do with an ``Idempotency-Key`` header.
"""

from decimal import Decimal

from django.db import IntegrityError, transaction

from tools.models import GatewayRefund


def refund(*, order_number: int, amount: Decimal, idempotency_key: str) -> tuple[dict, bool]:
    """Refund ``amount`` on ``order_number`` once per ``idempotency_key``.

    Returns ``(receipt, created)``: the receipt ``{"refund_id", "order_id",
    "amount", "idempotency_key"}`` and whether this request made the refund
    (False: an earlier one with the same key did).
    """
    try:
        with transaction.atomic():
            row, created = GatewayRefund.objects.get_or_create(
                idempotency_key=idempotency_key, defaults={"order_number": order_number, "amount": amount}
            )
    except IntegrityError:
        row, created = GatewayRefund.objects.get(idempotency_key=idempotency_key), False
    receipt = {"refund_id": row.pk, "order_id": row.order_number, "amount": str(row.amount),
               "idempotency_key": row.idempotency_key}
    return receipt, created
