"""The demo shop's tools (registered by ``tools.demo.apps.DemoConfig.ready``).

``query_order`` (read-only), ``cancel_order`` (side effect, always
approved by a person, only the requester's own unshipped orders),
``refund`` (side effect through the payment gateway, approval when the
refunds of the order over 30 days, this one included, add up to more
than 50), ``find_refundable_order`` (read-only: the requester's newest
order with room for a refund), ``legal_check`` (read-only) and ``send_email`` (side
effect, always approved, only after a passed legal check in the same run).

The handlers and preconditions that wait on the gateway (``query_order``,
``refund`` and its precondition, ``find_refundable_order``) are ``async
def``: they run on the engine's event loop, read orders in the sync
handler pool (``runs.base.awaiting.run_blocking``: Django's ORM is sync)
and ask the gateway with its async side, holding no thread while they
wait. The others stay sync; the engine runs them in the sync handler pool.
"""

from decimal import Decimal

from django.core.mail import BadHeaderError, EmailMessage
from django.db import transaction
from django.db.models import Q

from runs.base import selects
from runs.base.awaiting import run_blocking
from runs.models import ACTIVE_STATUSES, Run
from tools.demo import conf, gateway, summaries
from tools.demo.models import CONTESTED_ORDER, Order
from tools.models import ToolCall, ToolCallStatus
from tools.models.tool_call import PENDING_STATUSES  # a refund in one of these already counts on its order
from tools.registry import Tool, ToolContext, ToolError

S = ToolCallStatus
ORDER_ID = {"type": "integer", "minimum": 1, "description": "The order number."}
BLOCKED_PHRASES = ("guarantee", "no liability", "unlimited")


def _own_order(ctx: ToolContext, order_id: int) -> Order | None:
    """The requester's order ``order_id``, or None when it is not theirs or does not exist (one statement built
    once: the lookups of a run's every call and precondition, ``runs.base.selects``)."""
    found = selects.select(Order, {"number": order_id, "owner": ctx.user.pk})
    return found[0] if found else None


async def _refundable(order: Order) -> Decimal:
    """What may still be refunded: total less what the gateway refunded since the order's ``refunds_since``
    (0 if cancelled), asked on the running event loop (the gateway's async side).

    Raises ``ToolTimeout`` / ``ToolUnavailable`` when the gateway cannot be asked.
    """
    if order.status == Order.Status.CANCELLED:
        return Decimal("0")
    return order.total - await gateway.arefunded_total(order.number, since=order.refunds_since)


def _order_view(order: Order, refundable: Decimal) -> dict:
    """What ``query_order`` answers about ``order``, of which ``refundable`` may still be refunded."""
    return {
        "order_id": order.number,
        "total": str(order.total),
        "status": order.status,
        "shipped": order.shipped,
        "refunded": str(order.total - refundable) if order.status == Order.Status.OPEN else None,
        "refundable_amount": str(refundable),
    }


# --- query_order -------------------------------------------------------------

def _query_order_precondition(ctx: ToolContext, args: dict) -> str | None:
    if _own_order(ctx, args["order_id"]) is None:
        return f"Order {args['order_id']} does not exist or does not belong to the requester."
    return None


async def _query_order(ctx: ToolContext, args: dict) -> dict:
    order = await run_blocking(_own_order, ctx, args["order_id"])
    if order is None:
        raise ToolError(f"Order {args['order_id']} not found.")
    return _order_view(order, await _refundable(order))


QUERY_ORDER = Tool(
    name="query_order",
    description="Look up one of the requester's orders: total, shipping state, amount still refundable.",
    parameters={"type": "object", "properties": {"order_id": ORDER_ID},
                "required": ["order_id"], "additionalProperties": False},
    handler=_query_order,
    precondition=_query_order_precondition,
    summarize=summaries.summarize_order_lookups,
    title=summaries.order_lookup_title,
)


# --- cancel_order ------------------------------------------------------------

def _cancel_precondition(ctx: ToolContext, args: dict) -> str | None:
    order = _own_order(ctx, args["order_id"])
    if order is None:
        return f"Order {args['order_id']} does not exist or does not belong to the requester."
    if order.shipped:
        return f"Order {order.number} has already shipped and cannot be cancelled."
    if order.status == Order.Status.CANCELLED:
        return f"Order {order.number} is already cancelled."
    return None


def _cancel_order(ctx: ToolContext, args: dict) -> dict:
    with transaction.atomic():
        updated = Order.objects.filter(
            number=args["order_id"], owner=ctx.user, shipped=False, status=Order.Status.OPEN
        ).update(status=Order.Status.CANCELLED)
    if not updated:
        raise ToolError(f"Order {args['order_id']} can no longer be cancelled.")
    return {"order_id": args["order_id"], "status": Order.Status.CANCELLED}


CANCEL_ORDER = Tool(
    name="cancel_order",
    description="Cancel one of the requester's orders that has not shipped yet.",
    parameters={"type": "object",
                "properties": {"order_id": ORDER_ID, "reason": {"type": "string", "maxLength": 500}},
                "required": ["order_id"], "additionalProperties": False},
    handler=_cancel_order,
    side_effect=True,
    approval="always",
    precondition=_cancel_precondition,
    summarize=summaries.summarize_order_cancellations,
    title=summaries.order_cancellation_title,
)


# --- refund ------------------------------------------------------------------

async def _refund_precondition(ctx: ToolContext, args: dict) -> str | None:
    """Async (awaited on the engine's loop, ``tools.services.execution.call_hook``), as it waits on the gateway.

    A gateway that cannot be asked raises (``ToolTimeout``, ``ToolUnavailable``): the engine asks again
    after a pause, and denies the call if it still cannot (``check_precondition``)."""
    order = await run_blocking(_own_order, ctx, args["order_id"])
    if order is None:
        return f"Order {args['order_id']} does not exist or does not belong to the requester."
    refundable = await _refundable(order)
    if Decimal(str(args["amount"])) > refundable:
        return (f"Order {order.number} is not refundable for {args['amount']}: "
                f"at most {refundable} can be refunded.")
    return None


async def _refund(ctx: ToolContext, args: dict) -> dict:
    amount = Decimal(str(args["amount"])).quantize(Decimal("0.01"))
    order = await run_blocking(_own_order, ctx, args["order_id"])
    if order is None or order.status != Order.Status.OPEN:
        raise ToolError(f"Order {args['order_id']} is not refundable.")
    return await gateway.arefund(order_number=order.number, amount=amount, idempotency_key=ctx.idempotency_key,
                                 timeout_s=ctx.timeout_s)


REFUND = Tool(
    name="refund",
    description="Refund an amount on one of the requester's orders through the payment gateway.",
    parameters={"type": "object",
                "properties": {"order_id": ORDER_ID,
                               "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 100000}},
                "required": ["order_id", "amount"], "additionalProperties": False},
    handler=_refund,
    side_effect=True,
    approval="sum(amount) per target within 30d > 50",
    target_key="order_id",
    precondition=_refund_precondition,
    timeout_s=conf.gateway_timeout_s(),
    idempotent=True,
    reconcile=gateway.lookup,
    summarize=summaries.summarize_refunds,
    title=summaries.refund_title,
    judge_together=summaries.judge_refunds,
)


# --- find_refundable_order -----------------------------------------------------

async def _find_refundable_order(ctx: ToolContext, args: dict) -> dict:
    """The requester's newest open order that can take a refund of ``amount`` now (``query_order``'s view), held for this run.

    Skips ``CONTESTED_ORDER`` and orders with a refund under way or held by another run. Raises ``ToolError`` when none
    can, ``ToolTimeout`` / ``ToolUnavailable`` when the gateway cannot be asked.
    """
    amount = Decimal(str(args["amount"]))
    for order in await run_blocking(_refund_candidates, ctx, amount):
        refundable = await _refundable(order)
        if refundable >= amount and await run_blocking(_hold, order, ctx.run):
            return _order_view(order, refundable)
    raise ToolError(f"None of the requester's open orders can take a refund of {amount} now.")


def _held_by_another(run) -> Q:
    """Orders held for a run in progress other than ``run`` (``Order.held_for_run``)."""
    in_progress = Run.objects.filter(status__in=ACTIVE_STATUSES).exclude(pk=run.pk).values("pk")
    return Q(held_for_run__in=in_progress)


def _refund_candidates(ctx: ToolContext, amount: Decimal) -> list[Order]:
    """The requester's open orders of at least ``amount``, newest first, but the contested one, those a
    refund of theirs is already under way on and those another run in progress holds."""
    under_way = set(ToolCall.objects.filter(name=REFUND.name, run__requested_by=ctx.user, status__in=PENDING_STATUSES)
                    .values_list("arguments__order_id", flat=True))
    return list(Order.objects.filter(owner=ctx.user, status=Order.Status.OPEN, total__gte=amount)
                .exclude(number__in=under_way | {CONTESTED_ORDER}).exclude(_held_by_another(ctx.run))
                .order_by("-number"))


def _hold(order: Order, run) -> bool:
    """Hold ``order`` for ``run`` unless another run in progress holds it (one conditional UPDATE); True if held."""
    return Order.objects.filter(pk=order.pk).exclude(_held_by_another(run)).update(held_for_run=run.pk) == 1


FIND_REFUNDABLE_ORDER = Tool(
    name="find_refundable_order",
    description="Find the requester's newest open order that can take a refund of the given amount, "
                "skipping orders a refund is already under way on.",
    parameters={"type": "object",
                "properties": {"amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 100000}},
                "required": ["amount"], "additionalProperties": False},
    handler=_find_refundable_order,
)


# --- legal_check -------------------------------------------------------------

def _legal_check(ctx: ToolContext, args: dict) -> dict:
    found = [phrase for phrase in BLOCKED_PHRASES if phrase in args["text"].lower()]
    return {"approved": not found, "issues": [f"contains '{phrase}'" for phrase in found]}


LEGAL_CHECK = Tool(
    name="legal_check",
    description="Check a text (e.g. a contract email) for wording legal does not allow.",
    parameters={"type": "object", "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 20000}},
                "required": ["text"], "additionalProperties": False},
    handler=_legal_check,
)


# --- send_email --------------------------------------------------------------

def _passed_legal_check(run, text: str) -> bool:
    """Whether a legal_check of exactly ``text`` succeeded and approved it in ``run``."""
    return any(
        (call.result or {}).get("approved") is True and (call.arguments or {}).get("text") == text
        for call in ToolCall.objects.filter(run=run, name="legal_check", status=S.SUCCEEDED)
    )


def _send_email_precondition(ctx: ToolContext, args: dict) -> str | None:
    if not _passed_legal_check(ctx.run, args["body"]):
        return "send_email needs a legal_check in this run that succeeded and approved this exact body."
    return None


def _send_email(ctx: ToolContext, args: dict) -> dict:
    message = EmailMessage(subject=args["subject"], body=args["body"], to=[args["to"]],
                           headers={"X-Idempotency-Key": ctx.idempotency_key})
    try:
        message.send(fail_silently=False)
    except BadHeaderError as exc:  # refused before anything was sent
        raise ToolError(f"The email was not sent: {exc}") from exc
    return {"sent_to": args["to"], "subject": args["subject"]}


SEND_EMAIL = Tool(
    name="send_email",
    description="Send an email. Needs a passed legal_check of its text in the same run.",
    parameters={"type": "object",
                "properties": {"to": {"type": "string", "format": "email", "maxLength": 254},
                               "subject": {"type": "string", "format": "header-text",
                                           "minLength": 1, "maxLength": 300},
                               "body": {"type": "string", "minLength": 1, "maxLength": 20000}},
                "required": ["to", "subject", "body"], "additionalProperties": False},
    handler=_send_email,
    side_effect=True,
    approval="always",
    precondition=_send_email_precondition,
    summarize=summaries.summarize_emails,
    title=summaries.email_title,
)

# What the demo app registers, in this order.
DEMO_TOOLS = (QUERY_ORDER, CANCEL_ORDER, REFUND, FIND_REFUNDABLE_ORDER, LEGAL_CHECK, SEND_EMAIL)
