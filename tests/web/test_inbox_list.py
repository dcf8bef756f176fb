"""The inbox list page: keyset pages, sorts, filters, search, counts, related-item cues, and the row fragments."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import selectors
from approvals.models import Interrupt, InterruptKind
from approvals.selectors import InboxFilters
from tests.support.inbox import agent, pending_call
from tools.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db


def _ids(page) -> list[int]:
    return [row.pk for row in page.rows]


def _all_pages(user, filters=InboxFilters(), size=4) -> list[int]:
    """Every id, turning pages until the last."""
    seen, after = [], None
    while True:
        page = selectors.inbox_page(user=user, filters=filters, after=after, size=size)
        seen += _ids(page)
        if page.next_after is None:
            return seen
        after = page.next_after


@pytest.fixture
def spread(demo):
    """Nine items: expiries in 5 h, 1 h (twice: a tie), 30 h, never (twice), created at spread ages."""
    requester = demo["requester"]
    made = {}
    for name, hours, ago in [("a", 5, 1), ("b", 1, 2), ("c", 1, 3), ("d", 30, 4), ("e", None, 5), ("f", None, 6),
                             ("g", 72, 7), ("h", 0.5, 8), ("i", 2, 9)]:
        made[name] = pending_call(requester=requester, arguments={"order_id": 100 + len(made), "amount": 60},
                                  expires_in=None if hours is None else timedelta(hours=hours),
                                  created_ago=timedelta(minutes=ago))
    Interrupt.objects.filter(pk=made["c"].pk).update(expires_at=made["b"].expires_at)  # an exact tie
    return made


def test_expiring_soonest_is_the_default_and_never_expiring_items_come_last(spread, demo):
    order = [spread[n].pk for n in ("h", "b", "c", "i", "a", "d", "g", "e", "f")]
    assert _all_pages(demo["approver"]) == order
    assert _all_pages(demo["approver"], size=100) == order


def test_oldest_and_newest_sorts_page_the_same_items(spread, demo):
    by_age = [spread[n].pk for n in "ihgfedcba"]
    assert _all_pages(demo["approver"], InboxFilters(sort="oldest")) == by_age
    assert _all_pages(demo["approver"], InboxFilters(sort="newest"), size=2) == by_age[::-1]


def test_a_page_costs_the_same_queries_at_the_first_and_a_deep_page(spread, demo):
    demo["approver"].get_all_permissions()  # read once per user object (a request), cached for both pages
    with CaptureQueriesContext(connection) as first:
        selectors.inbox_page(user=demo["approver"], size=2)
    with CaptureQueriesContext(connection) as deep:
        page = selectors.inbox_page(user=demo["approver"], size=2, after=spread["i"].pk)
    assert _ids(page) == [spread["a"].pk, spread["d"].pk]
    assert len(deep) == len(first) + 1  # the anchor's row
    assert not any("OFFSET" in q["sql"] or "__count" in q["sql"] for q in deep)  # no skipping, no counting


def test_filters_by_kind_tool_agent_requester_and_search(demo, people_extra):
    approver, other = demo["approver"], people_extra
    refund = pending_call(requester=demo["requester"], arguments={"order_id": 101, "amount": 70})
    email = pending_call(requester=demo["requester"], name="send_email", agent_=agent("mailer"),
                         arguments={"to": "ceo@example.com", "subject": "Contract", "body": "Dear CEO"})
    theirs = pending_call(requester=other, arguments={"order_id": 102, "amount": 99})
    Interrupt.objects.filter(pk=theirs.pk).update(kind=InterruptKind.RECONCILIATION)

    def ids(**filters):
        return set(_ids(selectors.inbox_page(user=approver, filters=InboxFilters(**filters))))

    assert ids() == {refund.pk, email.pk, theirs.pk}
    assert ids(tool="send_email") == {email.pk}
    assert ids(agent="mailer") == {email.pk}
    assert ids(requester="other") == {theirs.pk}
    assert ids(kind="reconciliation") == {theirs.pk}
    assert ids(search="CEO@EXAMPLE") == {email.pk}
    assert ids(search="102") == {theirs.pk}
    assert ids(tool="refund", requester="requester") == {refund.pk}


@pytest.fixture
def people_extra(demo):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("other")


def test_the_page_shows_summary_risk_fields_rule_and_cues_and_pages_by_link(client, demo):
    for i in range(27):
        pending_call(requester=demo["requester"], arguments={"order_id": 110 + i % 3, "amount": 60 + i})
    client.force_login(demo["approver"])

    first = client.get("/inbox/")
    assert first.status_code == 200
    html = first.content.decode()
    assert html.count('class="inbox-item') == 25
    assert "<title>Inbox (27) · Tollgate</title>" in html
    assert re.search(r'id="nav-inbox".*?27<span class="count-label"> approval</span>', html, re.S)
    assert "Refund 60.00 on order 110 (total " in html
    assert "<dt>Amount</dt><dd>60.00</dd>" in html and "<dt>Order</dt><dd>110</dd>" in html
    assert "<code>sum(amount) per target &gt; 50</code>" in html
    assert "8 other pending items on order 110: 9 pending refunds ask" in html
    next_link = re.search(r'href="\?([^"]+)" id="next-page"', html).group(1).replace("&amp;", "&")

    second = client.get("/inbox/?" + next_link).content.decode()
    assert second.count('class="inbox-item') == 2 and "Page 2" in second and 'id="next-page"' not in second


def test_a_bad_query_string_answers_400_and_shows_why(client, demo):
    client.force_login(demo["approver"])
    for query in ("sort=sideways", "after=abc", "kind=nope", "tool=rm_rf", "q=" + "x" * 101, "after=-3"):
        response = client.get("/inbox/?" + query)
        assert response.status_code == 400, query
        assert b'id="filter-errors"' in response.content


def test_counts_are_one_capped_query_by_kind(demo, monkeypatch):
    for i in range(4):
        pending_call(requester=demo["requester"], arguments={"order_id": 101, "amount": 5})
    Interrupt.objects.filter(pk=Interrupt.objects.first().pk).update(kind=InterruptKind.INPUT)
    with CaptureQueriesContext(connection) as queries:
        counts = selectors.inbox_counts(user=demo["approver"])
    assert len([q for q in queries if "COUNT(" in q["sql"]]) == 1
    assert counts == {"total": 3, "capped": False, "by_kind": [("approval", 3)]}  # the input item is the requester's
    monkeypatch.setattr(selectors, "COUNT_CAP", 2)
    assert selectors.inbox_counts(user=demo["approver"]) == {"total": 2, "capped": True, "by_kind": [("approval", 2)]}


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


def test_row_fragments_render_only_what_the_user_may_decide(client, demo, people_extra):
    item = pending_call(requester=demo["requester"], arguments={"order_id": 101, "amount": 70})
    ToolCall.objects.filter(pk=item.tool_call_id).update(status=ToolCallStatus.AWAITING_APPROVAL)

    client.force_login(demo["approver"])
    mine = client.get(f"/inbox/rows/?run={item.run_id}&run=999999")
    assert mine.status_code == 200
    assert mine.content.decode().count('class="inbox-item') == 1 and f'data-run-id="{item.run_id}"' in mine.content.decode()
    assert client.get(f"/inbox/rows/?run={item.run_id}&tool=send_email").content.count(b'class="inbox-item') == 0

    client.force_login(people_extra)  # no permission, not their run
    theirs = client.get(f"/inbox/rows/?run={item.run_id}")
    assert theirs.status_code == 200 and b'class="inbox-item' not in theirs.content
    client.force_login(demo["requester"])  # their own run, but four eyes: not theirs to decide
    assert b'class="inbox-item' not in client.get(f"/inbox/rows/?run={item.run_id}").content

    for bad in ("", "?run=x", "?run=\u00b2", "?run=1&sort=up", "?" + "&".join(f"run={i}" for i in range(1, 102))):
        assert client.get("/inbox/rows/" + bad).status_code == 400, bad
    client.logout()
    assert client.get(f"/inbox/rows/?run={item.run_id}").status_code == 302


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


def test_a_filtered_page_looks_through_a_bounded_window_and_the_next_page_goes_on(spread, demo, monkeypatch):
    # Expiry order: h b c i a d g e f. Only "d" and "f" are send_email calls.
    ToolCall.objects.filter(pk__in=[spread["d"].tool_call_id, spread["f"].tool_call_id]).update(name="send_email")
    monkeypatch.setattr(selectors, "SCAN_WINDOW", 3)
    filters = InboxFilters(tool="send_email")

    first = selectors.inbox_page(user=demo["approver"], filters=filters)
    assert (_ids(first), first.window_ended, first.next_after) == ([], True, spread["c"].pk)  # looked at h b c
    second = selectors.inbox_page(user=demo["approver"], filters=filters, after=first.next_after)
    assert (_ids(second), second.window_ended, second.next_after) == ([spread["d"].pk], True, spread["d"].pk)
    third = selectors.inbox_page(user=demo["approver"], filters=filters, after=second.next_after)
    assert (_ids(third), third.window_ended, third.next_after) == ([spread["f"].pk], False, None)  # g e f: the end
    monkeypatch.setattr(selectors, "SCAN_WINDOW", 100)
    assert _ids(selectors.inbox_page(user=demo["approver"], filters=filters)) == [spread["d"].pk, spread["f"].pk]
