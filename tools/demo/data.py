"""Demo data: users, the shop's orders and three scripted demo agents.

``load_demo()`` is idempotent: running it again resets the demo rows to
their initial values, except the users' passwords (reset only when asked,
so nobody is logged out), and changes nothing else. Refunds made before it
no longer count against the orders; the payment gateway's ledger, which
keeps them, is not touched.
"""

from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import transaction
from django.utils import timezone

from runs.models import Agent
from tools.demo.models import CONTESTED_ORDER, Order

USERS = {
    # username: (password, role)
    "requester": ("requester-demo", "starts runs; owns orders 100-130"),
    "approver": ("approver-demo", "decides every demo tool's approvals"),
    "admin": ("admin-demo", "superuser"),
}
APPROVERS_GROUP = "approvers"
# The demo shop's orders, all owned by "requester".
DEMO_ORDER_NUMBERS = range(100, 131)

CONTRACT_TEXT = "Dear customer, please find attached the service contract we discussed."


def _refund_ending(order: str, **more: str) -> dict:
    """A refund agent's last turn: what it says after each way its refund ended (``content_by_status`` of the
    ``scripted`` provider). ``order`` names the order in the texts ("order 123"); ``more`` adds statuses."""
    return {"content": f"The refund for {order} did not go through.", "content_by_status": {
        "succeeded": "A refund of {result.amount} for order {result.order_id} has been issued.",
        "edited": "A refund of {result.amount} for order {result.order_id} has been issued "
                  "(the approver changed what I proposed).",
        "rejected": f"The refund for {order} was not approved, so nothing has been refunded. {{error}}",
        "denied": f"{order[0].upper()}{order[1:]} cannot be refunded as asked, so nothing has been refunded: "
                  "{error}",
        "failed": f"The refund for {order} failed, so nothing has been refunded: {{error}}",
        **more}}


DEMO_AGENTS = [
    {
        "slug": "refund-order",
        "name": "Refund order",
        "instructions": "Help the customer get a refund. Check the order first.",
        "completion_check": "refund",
        "tools": ["query_order", "refund"],
        "model": {"provider": "scripted", "turns": [
            {"tool_calls": [{"name": "query_order", "arguments": {"order_id": 123}}]},
            {"tool_calls": [{"name": "refund", "arguments": "{\"order_id\": 123, \"amount\": 80}"}]},
            _refund_ending("order 123"),
        ]},
    },
    {
        "slug": "refund-next-order",
        "name": "Refund next order",
        "instructions": "Refund 60.00 on the customer's newest order that can take it.",
        "completion_check": "refund",
        "tools": ["find_refundable_order", "refund"],
        "model": {"provider": "scripted", "turns": [
            {"tool_calls": [{"name": "find_refundable_order", "arguments": {"amount": 60}}]},
            {"tool_calls": [{"name": "refund", "arguments": {"order_id": "{result.order_id}", "amount": 60}}]},
            _refund_ending("the order", invalid="I found no order that can take a refund of 60.00, so nothing "
                                                "has been refunded."),
        ]},
    },
    {
        "slug": "cancel-order",
        "name": "Cancel order",
        "instructions": "Cancel the customer's order if it has not shipped.",
        "completion_check": "cancel_order",
        "tools": ["query_order", "cancel_order"],
        "model": {"provider": "scripted", "turns": [
            {"tool_calls": [{"name": "query_order", "arguments": {"order_id": 124}}]},
            {"tool_calls": [{"name": "cancel_order", "arguments": {"order_id": 124, "reason": "customer request"}}]},
            {"content": "Order 124 was not cancelled.", "content_by_status": {
                "succeeded": "Order {result.order_id} has been cancelled.",
                "edited": "Order {result.order_id} has been cancelled (the approver changed what I proposed).",
                "rejected": "Cancelling order 124 was not approved, so the order stands. {error}",
                "denied": "I'm sorry, I could not cancel order 124: {error}",
                "failed": "Order 124 could not be cancelled: {error}"}},
        ]},
    },
    {
        "slug": "send-contract-email",
        "name": "Send contract email",
        "instructions": "Send the contract email after legal has checked it.",
        "completion_check": "send_email",
        "tools": ["legal_check", "send_email"],
        "model": {"provider": "scripted", "turns": [
            {"tool_calls": [{"name": "legal_check", "arguments": {"text": CONTRACT_TEXT}}]},
            {"tool_calls": [{"name": "send_email", "arguments": {
                "to": "customer@example.com", "subject": "Your contract", "body": CONTRACT_TEXT}}]},
            {"content": "The contract email was not sent.", "content_by_status": {
                "succeeded": "The contract email has been sent to {result.sent_to}.",
                "edited": "The contract email has been sent to {result.sent_to}, as the approver changed it.",
                "rejected": "The contract email was not sent: it was not approved. {error}",
                "denied": "The contract email was not sent: {error}",
                "failed": "The contract email could not be sent: {error}"}},
        ]},
    },
]


@transaction.atomic
def load_demo(*, reset_passwords: bool = False) -> dict[str, str | None]:
    """Create or reset the demo users, orders and agents.

    A demo user gets its known password when it is created, or when
    ``reset_passwords`` says so; otherwise its password, and with it every
    log-in of that user, is left alone. Returns ``{username: password}``,
    the password ``None`` where it was left alone.
    """
    User = get_user_model()
    approvers, _ = Group.objects.get_or_create(name=APPROVERS_GROUP)
    approvers.permissions.add(Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals"))
    users, passwords = {}, {}
    for username, (password, _role) in USERS.items():
        user, created = User.objects.get_or_create(username=username)
        passwords[username] = password if created or reset_passwords else None
        if passwords[username] is not None:
            user.set_password(password)
        user.email = f"{username}@example.com"
        user.is_staff = user.is_superuser = username == "admin"
        user.save()
        users[username] = user
    users["approver"].groups.add(approvers)

    # Refunds made before now stop counting: every order is refundable in full again, while the
    # payment gateway keeps its ledger (``Order.refunds_since``).
    now = timezone.now()
    for number in DEMO_ORDER_NUMBERS:
        Order.objects.update_or_create(number=number, defaults={
            "owner": users["requester"],
            "total": Decimal("120.00") if number == CONTESTED_ORDER else Decimal(20 + number % 7 * 15),
            "shipped": number == 124 or number % 2 == 0 and number != CONTESTED_ORDER,
            "status": Order.Status.OPEN,
            "refunds_since": now,
            "held_for_run": None,
        })
    for spec in DEMO_AGENTS:
        # The current version is reset in place (and taken out of the archive): a reset restores the demo.
        Agent.objects.update_or_create(slug=spec["slug"], is_current=True,
                                       defaults={**{k: v for k, v in spec.items() if k != "slug"}, "archived_at": None})
    return passwords
