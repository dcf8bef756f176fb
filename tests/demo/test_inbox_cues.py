"""What the demo's refunds add to an inbox row: their summary and fields, and their verdict on refunds together.

The list itself (pages, sorts, filters, counts, the cue's count and cap) runs on the tests' own tools in
tests/web/test_inbox_list.py; these are the demo refund tool's ``summarize`` and ``judge_together``, read
through the inbox (``approvals.selectors``).
"""

import pytest

from approvals import selectors
from tests.support.inbox import pending_call

pytestmark = pytest.mark.django_db


def test_a_refund_row_shows_its_summary_fields_and_the_refunds_together(client, demo):
    for i in range(9):
        pending_call(requester=demo["requester"], arguments={"order_id": 110, "amount": 60 + 3 * i})
    client.force_login(demo["approver"])

    html = client.get("/inbox/").content.decode()

    assert "Refund 60.00 on order 110 (total " in html
    assert "<dt>Amount</dt><dd>60.00</dd>" in html and "<dt>Order</dt><dd>110</dd>" in html
    assert "<code>sum(amount) per target &gt; 50</code>" in html
    assert "8 other pending items on order 110: 9 pending refunds ask" in html
    assert html.count('<p class="related conflict">') == 9  # together they ask more than the order holds


def test_refunds_asking_more_than_is_left_are_flagged_and_ones_that_fit_are_not(demo):
    pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": 70})
    pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": 70})
    pending_call(requester=demo["requester"], arguments={"order_id": 112, "amount": 1})
    alone = pending_call(requester=demo["requester"], arguments={"order_id": 113, "amount": 1})
    pending_call(requester=demo["requester"], arguments={"order_id": 112, "amount": 1})

    rows = {row.pk: row for row in selectors.inbox_page(user=demo["approver"]).rows}
    cues = [row.related for row in rows.values() if row.related]
    assert rows[alone.pk].related is None
    assert sorted((c.others, c.together.all_can_succeed) for c in cues) == [(1, False), (1, False), (1, True), (1, True)]
    assert any("ask 140.00; only 120.00 refundable" in c.together.note for c in cues)


def test_related_cues_read_a_bounded_number_of_items_and_stay_truthful_when_capped(demo, monkeypatch):
    for amount in (10, 10, 10):
        pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": amount})
    for amount in (100, 100, 100):
        pending_call(requester=demo["requester"], arguments={"order_id": 112, "amount": amount})
    monkeypatch.setattr(selectors, "RELATED_CAP", 5)

    cues = {row.tool_call.arguments["order_id"]: row.related for row in selectors.inbox_page(user=demo["approver"]).rows}

    assert cues[112].capped and cues[123].capped
    assert cues[112].together.all_can_succeed is False  # even two of them ask more than order 112 holds
    assert cues[123].together.all_can_succeed is None  # they fit so far, but some were not read
