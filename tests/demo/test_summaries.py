"""The demo refund tool's summaries of pending calls (``tools.demo.summaries`` through ``tools.services.summary``):
its line and risk fields, one query per kind for many calls, pending refunds on one order judged together."""

from decimal import Decimal

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.inbox import pending_call
from tools.demo.models import Order
from tools.models import ToolCall, ToolCallStatus
from tools.registry import get_tool
from tools.services.summary import describe, describe_many, judge_groups
from tools.services.targets import target_key


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


def test_refunds_so_far_are_found_by_their_target_and_a_call_stored_without_one_by_its_arguments(demo):
    """The refunded-so-far figure reads the refunds by ``ToolCall.target`` (an indexed column: no scan of every
    refund's arguments), a call stored with no target (before the column was filled) by its arguments, and a
    refund on another order counts for that order only."""
    item = pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": 80})
    refunds = [pending_call(requester=demo["requester"], arguments={"order_id": number, "amount": amount})
               for number, amount in ((123, 10), (123, 2.5), (124, 7))]
    refund = get_tool("refund")
    for call in refunds:
        ToolCall.objects.filter(pk=call.tool_call_id).update(
            status=ToolCallStatus.SUCCEEDED, target=target_key(refund, call.tool_call.arguments))
    ToolCall.objects.filter(pk=refunds[1].tool_call_id).update(target="")  # stored before the column was filled

    assert describe(item.tool_call).text == "Refund 80.00 on order 123 (total 120.00, refunded 12.50)"


def test_a_refund_answered_with_an_earlier_refunds_result_is_not_counted_again(demo):
    """A reused refund (``duplicate_of``: the same action, done once) refunded nothing: the figure counts its
    original only, as the gateway does (and as per-target rules count, ``tools.services.proposal``)."""
    item = pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": 80})
    original, reused = (pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": 10})
                        for _ in range(2))
    refund = get_tool("refund")
    for call in (original, reused):
        ToolCall.objects.filter(pk=call.tool_call_id).update(
            status=ToolCallStatus.SUCCEEDED, target=target_key(refund, call.tool_call.arguments))
    ToolCall.objects.filter(pk=reused.tool_call_id).update(duplicate_of=original.tool_call_id)

    assert describe(item.tool_call).text == "Refund 80.00 on order 123 (total 120.00, refunded 10.00)"


def test_an_approvers_edit_moves_a_refund_to_the_order_it_now_names(demo):
    """A refund proposed on order 124 and approved edited to order 123 counts on 123 (its target moved with
    its arguments, ``ToolCall.make_ready``), not on 124."""
    from approvals.services import decide_interrupt

    moved = pending_call(requester=demo["requester"], arguments={"order_id": 124, "amount": 10})
    decide_interrupt(interrupt=moved, user=demo["approver"], decision="approved",
                     edited_arguments={"order_id": 123, "amount": 10})
    ToolCall.objects.filter(pk=moved.tool_call_id).update(status=ToolCallStatus.SUCCEEDED)
    on_123, on_124 = (pending_call(requester=demo["requester"], arguments={"order_id": number, "amount": 1})
                      for number in (123, 124))

    assert describe(on_123.tool_call).text == "Refund 1.00 on order 123 (total 120.00, refunded 10.00)"
    assert describe(on_124.tool_call).text.endswith("refunded 0.00)")


def test_an_order_number_written_as_a_whole_float_reads_as_that_order(demo):
    """``123.0`` passes the refund's schema (``integer``) and is stored as given: its summary still names the
    order's total and what was refunded on it, as ``123`` does."""
    item = pending_call(requester=demo["requester"], arguments={"order_id": 123.0, "amount": 80})

    assert describe(item.tool_call).risk_fields[2] == ("Total", "120.00")


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


def test_pending_refunds_on_one_order_are_judged_together(demo):
    Order.objects.filter(number=110).update(total=Decimal("95.00"))
    fit, too_much = judge_groups("refund", [[{"order_id": 110, "amount": 40}, {"order_id": 110, "amount": 55}],
                                            [{"order_id": 110, "amount": 70}, {"order_id": 110, "amount": 70}]])
    assert fit.all_can_succeed is True and "95.00 refundable" in fit.note
    assert too_much.all_can_succeed is False and "ask 140.00; only 95.00 refundable" in too_much.note
    assert judge_groups("send_email", [[{"to": "a@example.com"}]])[0].all_can_succeed is None
