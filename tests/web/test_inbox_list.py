"""The inbox list page: keyset pages, sorts, filters, search, counts, related-item cues, and the row fragments.

On the tests' own tools (``fake_transfer`` items made by ``tests.support.core.pending_transfer``); what the demo's
refunds add to a row (their summary, fields and verdict on refunds together) is tests/demo/test_inbox_cues.py.
"""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import selectors
from approvals.models import Interrupt, InterruptKind
from approvals.selectors import InboxFilters
from tests.support.core import pending_transfer
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
def spread(people):
    """Nine items: expiries in 5 h, 1 h (twice: a tie), 30 h, never (twice), created at spread ages."""
    requester = people["requester"]
    made = {}
    for name, hours, ago in [("a", 5, 1), ("b", 1, 2), ("c", 1, 3), ("d", 30, 4), ("e", None, 5), ("f", None, 6),
                             ("g", 72, 7), ("h", 0.5, 8), ("i", 2, 9)]:
        made[name] = pending_transfer(requester=requester, account=f"acct-{100 + len(made)}", amount=60,
                                      expires_in=None if hours is None else timedelta(hours=hours),
                                      created_ago=timedelta(minutes=ago))
    Interrupt.objects.filter(pk=made["c"].pk).update(expires_at=made["b"].expires_at)  # an exact tie
    return made


def test_expiring_soonest_is_the_default_and_never_expiring_items_come_last(spread, people):
    order = [spread[n].pk for n in ("h", "b", "c", "i", "a", "d", "g", "e", "f")]
    assert _all_pages(people["approver"]) == order
    assert _all_pages(people["approver"], size=100) == order


def test_oldest_and_newest_sorts_page_the_same_items(spread, people):
    by_age = [spread[n].pk for n in "ihgfedcba"]
    assert _all_pages(people["approver"], InboxFilters(sort="oldest")) == by_age
    assert _all_pages(people["approver"], InboxFilters(sort="newest"), size=2) == by_age[::-1]


def test_a_page_costs_the_same_queries_at_the_first_and_a_deep_page(spread, people):
    people["approver"].get_all_permissions()  # read once per user object (a request), cached for both pages
    with CaptureQueriesContext(connection) as first:
        selectors.inbox_page(user=people["approver"], size=2)
    with CaptureQueriesContext(connection) as deep:
        page = selectors.inbox_page(user=people["approver"], size=2, after=spread["i"].pk)
    assert _ids(page) == [spread["a"].pk, spread["d"].pk]
    assert len(deep) == len(first) + 1  # the anchor's row
    assert not any("OFFSET" in q["sql"] or "__count" in q["sql"] for q in deep)  # no skipping, no counting


def test_filters_by_kind_tool_agent_requester_and_search(people, people_extra):
    approver, other = people["approver"], people_extra
    transfer = pending_transfer(requester=people["requester"], account="acct-101", amount=70)
    lookup = pending_call(requester=people["requester"], name="fake_lookup", agent_=agent("looker"),
                          arguments={"key": "ceo@example.com"})
    theirs = pending_transfer(requester=other, account="acct-102", amount=99)
    Interrupt.objects.filter(pk=theirs.pk).update(kind=InterruptKind.RECONCILIATION)

    def ids(**filters):
        return set(_ids(selectors.inbox_page(user=approver, filters=InboxFilters(**filters))))

    assert ids() == {transfer.pk, lookup.pk, theirs.pk}
    assert ids(tool="fake_lookup") == {lookup.pk}
    assert ids(agent="looker") == {lookup.pk}
    assert ids(requester="other") == {theirs.pk}
    assert ids(kind="reconciliation") == {theirs.pk}
    assert ids(search="CEO@EXAMPLE") == {lookup.pk}
    assert ids(search="102") == {theirs.pk}
    assert ids(tool="fake_transfer", requester="requester") == {transfer.pk}


@pytest.fixture
def people_extra(people):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("other")


def test_the_page_shows_summary_risk_fields_rule_and_cues_and_pages_by_link(client, people):
    for i in range(27):
        pending_transfer(requester=people["requester"], account=f"acct-{110 + i % 3}", amount=60 + i)
    client.force_login(people["approver"])

    first = client.get("/inbox/")
    assert first.status_code == 200
    html = first.content.decode()
    assert html.count('class="inbox-item') == 25
    assert "<title>Inbox (27) · Tollgate</title>" in html
    assert re.search(r'id="nav-inbox".*?27<span class="count-label"> approval</span>', html, re.S)
    assert 'class="open-item summary">fake_transfer(account=acct-110, amount=60)</a>' in html
    assert "<dt>amount</dt><dd>60</dd>" in html and "<dt>account</dt><dd>acct-110</dd>" in html
    assert "<code>amount &gt; 10</code>" in html
    assert "8 other pending items on account acct-110</p>" in html
    next_link = re.search(r'href="\?([^"]+)" id="next-page"', html).group(1).replace("&amp;", "&")

    second = client.get("/inbox/?" + next_link).content.decode()
    assert second.count('class="inbox-item') == 2 and "Page 2" in second and 'id="next-page"' not in second


def test_a_bad_query_string_answers_400_and_shows_why(client, people):
    client.force_login(people["approver"])
    for query in ("sort=sideways", "after=abc", "kind=nope", "tool=rm_rf", "q=" + "x" * 101, "after=-3"):
        response = client.get("/inbox/?" + query)
        assert response.status_code == 400, query
        assert b'id="filter-errors"' in response.content


def test_counts_are_one_capped_query_by_kind(people, monkeypatch):
    for i in range(4):
        pending_transfer(requester=people["requester"], account="acct-101", amount=5)
    Interrupt.objects.filter(pk=Interrupt.objects.first().pk).update(kind=InterruptKind.INPUT)
    with CaptureQueriesContext(connection) as queries:
        counts = selectors.inbox_counts(user=people["approver"])
    assert len([q for q in queries if "COUNT(" in q["sql"]]) == 1
    assert counts == {"total": 3, "capped": False, "by_kind": [("approval", 3)]}  # the input item is the requester's
    monkeypatch.setattr(selectors, "COUNT_CAP", 2)
    assert selectors.inbox_counts(user=people["approver"]) == {"total": 2, "capped": True, "by_kind": [("approval", 2)]}


def test_row_fragments_render_only_what_the_user_may_decide(client, people, people_extra):
    item = pending_transfer(requester=people["requester"], account="acct-101", amount=70)
    ToolCall.objects.filter(pk=item.tool_call_id).update(status=ToolCallStatus.AWAITING_APPROVAL)

    client.force_login(people["approver"])
    mine = client.get(f"/inbox/rows/?run={item.run_id}&run=999999")
    assert mine.status_code == 200
    assert mine.content.decode().count('class="inbox-item') == 1 and f'data-run-id="{item.run_id}"' in mine.content.decode()
    assert client.get(f"/inbox/rows/?run={item.run_id}&tool=fake_lookup").content.count(b'class="inbox-item') == 0

    client.force_login(people_extra)  # no permission, not their run
    theirs = client.get(f"/inbox/rows/?run={item.run_id}")
    assert theirs.status_code == 200 and b'class="inbox-item' not in theirs.content
    client.force_login(people["requester"])  # their own run, but four eyes: not theirs to decide
    assert b'class="inbox-item' not in client.get(f"/inbox/rows/?run={item.run_id}").content

    for bad in ("", "?run=x", "?run=\u00b2", "?run=1&sort=up", "?" + "&".join(f"run={i}" for i in range(1, 102))):
        assert client.get("/inbox/rows/" + bad).status_code == 400, bad
    client.logout()
    assert client.get(f"/inbox/rows/?run={item.run_id}").status_code == 302


def test_a_filtered_page_looks_through_a_bounded_window_and_the_next_page_goes_on(spread, people, monkeypatch):
    # Expiry order: h b c i a d g e f. Only "d" and "f" are fake_lookup calls.
    ToolCall.objects.filter(pk__in=[spread["d"].tool_call_id, spread["f"].tool_call_id]).update(name="fake_lookup")
    monkeypatch.setattr(selectors, "SCAN_WINDOW", 3)
    filters = InboxFilters(tool="fake_lookup")

    first = selectors.inbox_page(user=people["approver"], filters=filters)
    assert (_ids(first), first.window_ended, first.next_after) == ([], True, spread["c"].pk)  # looked at h b c
    second = selectors.inbox_page(user=people["approver"], filters=filters, after=first.next_after)
    assert (_ids(second), second.window_ended, second.next_after) == ([spread["d"].pk], True, spread["d"].pk)
    third = selectors.inbox_page(user=people["approver"], filters=filters, after=second.next_after)
    assert (_ids(third), third.window_ended, third.next_after) == ([spread["f"].pk], False, None)  # g e f: the end
    monkeypatch.setattr(selectors, "SCAN_WINDOW", 100)
    assert _ids(selectors.inbox_page(user=people["approver"], filters=filters)) == [spread["d"].pk, spread["f"].pk]
