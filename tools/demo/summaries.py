"""How the demo tools' calls read to a person (``Tool.title``, ``Tool.summarize``, ``Tool.judge_together``).

A title is the call's own facts ("Refund 80.00 on order 123") and reads
nothing. Every summary hook is batched: it reads what it needs for all the calls it is
given in one or two queries. The refund reads the order's total from
``Order`` and what was refunded so far from the refunds Tollgate recorded
as succeeded (its own record, so a page never waits on the gateway),
counting, like the refund tool asking the gateway, only those sent since
the order's ``refunds_since``.
"""

from collections import defaultdict
from decimal import Decimal, InvalidOperation

from django.utils.translation import gettext as _

from runs.base import selects
from tools.demo.models import Order
from tools.models import ToolCallStatus
from tools.registry import Description, Together, get_tool
from tools.services.targets import calls_on_any, target_of

CENTS = Decimal("0.01")
BODY_CHARS = 80  # how much of an email body a summary shows


def _money(value) -> Decimal | None:
    try:
        return Decimal(str(value)).quantize(CENTS)
    except (InvalidOperation, ValueError, TypeError):
        return None


def _order_numbers(arguments_list: list[dict]) -> set[int]:
    """The order numbers the calls name: whole numbers, ``123.0`` as ``123`` (the tool's schema takes both as an
    integer, and ``123.0`` finds order 123 in a dict keyed by ``123``)."""
    numbers = (a.get("order_id") for a in arguments_list)
    return {int(n) for n in numbers
            if (isinstance(n, int) and not isinstance(n, bool)) or (isinstance(n, float) and n.is_integer())}


def _orders(numbers: set[int]) -> dict[int, Order]:
    """The orders numbered ``numbers``, by number (one query)."""
    return {order.number: order for order in selects.select(Order, {"number__in": sorted(numbers)})} if numbers else {}


def _refunded(orders: dict[int, Order]) -> dict[int, Decimal]:
    """What was refunded so far per order, from the refunds recorded as succeeded (one query, by the calls'
    target: ``calls_on_any``, through its index, not a scan of every refund's arguments).

    A refund counts if it was sent (``started_at``; ``created_at`` if it has
    none) at or after its order's ``refunds_since``: the refund tool asks the
    gateway for the same refunds, so the inbox and an order lookup agree. A
    refund answered with an earlier one's result (``duplicate_of``) refunded
    nothing and is not counted.
    """
    totals: dict[int, Decimal] = defaultdict(Decimal)
    refund = get_tool("refund")
    targets = [target_of(refund, {refund.target_key: number}) for number in sorted(orders)]
    if targets:
        for arguments, started_at, created_at in calls_on_any(targets).filter(
                name="refund", status=ToolCallStatus.SUCCEEDED, duplicate_of__isnull=True
        ).order_by().values_list("arguments", "started_at", "created_at"):
            since = getattr(orders.get(arguments["order_id"]), "refunds_since", None)
            if since is None or (started_at or created_at) >= since:
                totals[arguments["order_id"]] += _money(arguments.get("amount")) or Decimal("0")
    return totals


def _refundable(order: Order | None, refunded: Decimal) -> Decimal | None:
    if order is None:
        return None
    return Decimal("0") if order.status == Order.Status.CANCELLED else order.total - refunded


def _amount(arguments: dict):
    """The refund's amount with two decimals, or as given when it is not a number."""
    amount = _money(arguments.get("amount"))
    return arguments.get("amount") if amount is None else amount


def refund_title(arguments: dict) -> str:
    """"Refund 80.00 on order 123". No query."""
    return _("Refund %(amount)s on order %(order)s") % {"amount": _amount(arguments),
                                                        "order": arguments.get("order_id")}


def order_lookup_title(arguments: dict) -> str:
    """"Look up order 123". No query."""
    return _("Look up order %(order)s") % {"order": arguments.get("order_id")}


def order_cancellation_title(arguments: dict) -> str:
    """"Cancel order 124". No query."""
    return _("Cancel order %(order)s") % {"order": arguments.get("order_id")}


def email_title(arguments: dict) -> str:
    """"Email to a@b.example: <subject>". No query."""
    return _("Email to %(to)s: %(subject)s") % {"to": arguments.get("to", ""), "subject": arguments.get("subject", "")}


def summarize_refunds(arguments_list: list[dict]) -> list[Description]:
    """"Refund 80.00 on order 123 (total 120.00, refunded 0.00)" per call; risk fields amount, order, total,
    refunded so far. Two queries for any number of calls."""
    numbers = _order_numbers(arguments_list)
    orders = _orders(numbers)
    refunded = _refunded(orders)
    described = []
    for arguments in arguments_list:
        number, amount = arguments.get("order_id"), _money(arguments.get("amount"))
        order, so_far = orders.get(number), refunded.get(number, Decimal("0")).quantize(CENTS)
        fields = [(_("Amount"), str(amount)), (_("Order"), str(number))]
        if order is None:
            text = _("Refund %(amount)s on order %(order)s (no such order)") % {"amount": amount, "order": number}
        else:
            fields += [(_("Total"), str(order.total)), (_("Refunded so far"), str(so_far))]
            text = _("Refund %(amount)s on order %(order)s (total %(total)s, refunded %(refunded)s)") % {
                "amount": amount, "order": number, "total": order.total, "refunded": so_far}
        described.append(Description(text=text, risk_fields=tuple(fields),
                                     target=_("order %(order)s") % {"order": number}))
    return described


def judge_refunds(groups: list[list[dict]]) -> list[Together]:
    """Per group of pending refunds on one order: can all be paid (their sum within what is still refundable)?"""
    numbers = {number for group in groups for number in _order_numbers(group)}
    orders = _orders(numbers)
    refunded = _refunded(orders)
    verdicts = []
    for group in groups:
        number = group[0].get("order_id")
        asked = sum((_money(a.get("amount")) or Decimal("0") for a in group), Decimal("0.00"))
        left = _refundable(orders.get(number), refunded.get(number, Decimal("0")).quantize(CENTS))
        if left is None:
            verdicts.append(Together(all_can_succeed=None))
            continue
        words = {"count": len(group), "asked": asked, "left": left}
        if asked <= left:
            verdicts.append(Together(True, _("%(count)d pending refunds ask %(asked)s; %(left)s refundable: "
                                             "all can be paid") % words))
        else:
            verdicts.append(Together(False, _("%(count)d pending refunds ask %(asked)s; only %(left)s refundable: "
                                              "not all can be paid") % words))
    return verdicts


def summarize_order_lookups(arguments_list: list[dict]) -> list[Description]:
    """"Look up order 123" per call; risk field order. No query."""
    return [Description(text=order_lookup_title(a),
                        risk_fields=((_("Order"), str(a.get("order_id"))),),
                        target=_("order %(order)s") % {"order": a.get("order_id")}) for a in arguments_list]


def summarize_order_cancellations(arguments_list: list[dict]) -> list[Description]:
    """"Cancel order 124 (total 40.00)" per call; risk fields order, total, reason. One query."""
    orders = _orders(_order_numbers(arguments_list))
    described = []
    for arguments in arguments_list:
        number, order = arguments.get("order_id"), orders.get(arguments.get("order_id"))
        fields = [(_("Order"), str(number))]
        if order is not None:
            fields.append((_("Total"), str(order.total)))
        if arguments.get("reason"):
            fields.append((_("Reason"), arguments["reason"][:BODY_CHARS]))
        text = (_("Cancel order %(order)s (total %(total)s)") % {"order": number, "total": order.total}
                if order is not None else _("Cancel order %(order)s (no such order)") % {"order": number})
        described.append(Description(text=text, risk_fields=tuple(fields),
                                     target=_("order %(order)s") % {"order": number}))
    return described


def summarize_emails(arguments_list: list[dict]) -> list[Description]:
    """"Email to a@b.example: <subject>" per call; risk fields recipient, subject, start of the body. No query."""
    described = []
    for arguments in arguments_list:
        body = " ".join(str(arguments.get("body", "")).split())
        if len(body) > BODY_CHARS:
            body = body[: BODY_CHARS - 1] + "…"
        to, subject = str(arguments.get("to", "")), str(arguments.get("subject", ""))
        described.append(Description(
            text=email_title(arguments),
            risk_fields=((_("Recipient"), to), (_("Subject"), subject), (_("Body"), body)),
            target=to))
    return described
