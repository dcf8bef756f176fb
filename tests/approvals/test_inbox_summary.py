"""Per-tool summaries of pending calls (``tools.services.summary``) and the facts kept on an inbox item."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.engine.actors import advance_run
from runs.engine.lifecycle import start_run
from runs.models import Run
from tests.support.core import lookup, transfer
from tests.support.durability import make_agent
from tests.support.inbox import pending_call
from tools.demo.models import Order
from tools.models import ToolCall, ToolCallStatus
from tools.services.summary import Description, describe, describe_many, judge_groups


def _call(name, arguments):
    return ToolCall(name=name, arguments=arguments)


def test_a_refund_reads_as_amount_order_total_and_refunded_so_far(demo):
    item = pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": 80})
    succeeded = pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": 15.5})
    ToolCall.objects.filter(pk=succeeded.tool_call_id).update(status=ToolCallStatus.SUCCEEDED)

    description = describe(item.tool_call)

    assert description.text == "Refund 80.00 on order 123 (total 120.00, refunded 15.50)"
    assert description.risk_fields == (("Amount", "80.00"), ("Order", "123"), ("Total", "120.00"),
                                       ("Refunded so far", "15.50"))
    assert description.target == "order 123"


def test_describe_many_costs_the_same_queries_for_3_or_30_calls_and_keeps_the_order(demo):
    def calls(n):
        return [_call("refund", {"order_id": 100 + i % 20, "amount": 10 + i}) if i % 3
                else _call("send_email", {"to": f"x{i}@example.com", "subject": f"S{i}", "body": "Hello\nthere"})
                for i in range(n)]

    with CaptureQueriesContext(connection) as few:
        small = describe_many(calls(3))
    with CaptureQueriesContext(connection) as many:
        large = describe_many(calls(30))

    assert len(few) == len(many) == 2  # the orders, the refunds so far
    assert [d.text.split(" ")[0] for d in large[:4]] == ["Email", "Refund", "Refund", "Email"]
    assert large[0].risk_fields == (("Recipient", "x0@example.com"), ("Subject", "S0"), ("Body", "Hello there"))
    assert small[1].text.startswith("Refund 11.00 on order 101 (total ")


def test_a_tool_without_a_hook_reads_as_its_name_and_top_level_arguments(people):
    long_text = "word " * 40
    description = describe(_call("fake_transfer", {"to": "acct-9", "amount": 12.0, "note": long_text}))
    # the schema's keys first, in its order (amount), then the others by name: the same on every database
    assert description.text.startswith("fake_transfer(amount=12, note=word word")
    assert (description.risk_fields[0], description.risk_fields[2]) == (("amount", "12"), ("to", "acct-9"))
    assert len(description.risk_fields[1][1]) == 60
    assert describe(_call("no_such_tool", None)) == Description(text="no_such_tool")


def test_the_fallback_line_masks_credentials(people):
    description = describe(_call("fake_transfer", {"to": "acct-9", "api_key": "sk-live-0123456789abcdef"}))
    assert "sk-live-0123456789abcdef" not in description.text
    assert dict(description.risk_fields)["api_key"] == "***"


def test_pending_refunds_on_one_order_are_judged_together(demo):
    Order.objects.filter(number=110).update(total=Decimal("95.00"))
    fit, too_much = judge_groups("refund", [[{"order_id": 110, "amount": 40}, {"order_id": 110, "amount": 55}],
                                            [{"order_id": 110, "amount": 70}, {"order_id": 110, "amount": 70}]])
    assert fit.all_can_succeed is True and "95.00 refundable" in fit.note
    assert too_much.all_can_succeed is False and "ask 140.00; only 95.00 refundable" in too_much.note
    assert judge_groups("send_email", [[{"to": "a@example.com"}]])[0].all_can_succeed is None


@pytest.mark.django_db(transaction=True)
def test_the_rule_that_fired_and_the_target_are_kept_on_the_item(people, worker):
    agent = make_agent("transfer-80", [{"tool_calls": [lookup("acme")]}, {"tool_calls": [transfer("acme", 80)]},
                                       {"content": "Sent."}], tools=["fake_lookup", "fake_transfer"],
                       check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="send 80 to acme")
    advance_run.send(run.pk)
    worker.drain()

    item = Run.objects.get(pk=run.pk).interrupts.get()
    assert (item.rule, item.target) == ("amount > 10", 'fake_transfer:"acme"')
