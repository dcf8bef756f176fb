"""Real-browser test of the inbox list (issue 12, Prove 1): 150 waiting items in headless Chromium.

Against ``manage.py serve`` (the ``served`` fixture of tests/browser/test_browser.py).
The items are made before the browser starts (``tests.support.inbox``);
changes made while the page is open run in a thread of their own, since
Django refuses ORM calls from the thread where Playwright's loop runs.
"""

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections
from playwright.sync_api import expect

from runs.engine.lifecycle import cancel_run
from tests.support.inbox import agent, pending_call
from tests.support.browser import browser, served  # noqa: F401 (fixtures)
from tests.browser.test_i18n import PHONE, _assert_fits, _context, _log_in
from tools.demo.models import Order

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REFUNDS, EMAILS = 144, 6


@pytest.fixture
def waiting_items(demo):
    """150 pending items: 144 refunds (two on order 123, the first to expire; the rest one order each),
    6 emails of another requester and agent, expiring last. Returns ``{"soonest": [ids], "emails": [ids], "runs": [ids]}``."""
    from django.contrib.auth import get_user_model

    second = get_user_model().objects.create_user("buyer")
    for number in range(2000, 2000 + REFUNDS):
        Order.objects.create(number=number, owner=demo["requester"], total=Decimal("150.00"))
    soonest = [pending_call(requester=demo["requester"], arguments={"order_id": 123, "amount": amount},
                            expires_in=timedelta(minutes=minutes)).pk
               for amount, minutes in ((80, 20), (70, 40))]
    runs = []
    for i in range(REFUNDS - 2):
        item = pending_call(requester=demo["requester"], arguments={"order_id": 2000 + i, "amount": 51 + i % 40},
                            expires_in=timedelta(hours=2 + (i * 37) % 90), created_ago=timedelta(minutes=i))
        runs.append(item.run_id)
    mailer = agent("mailer")
    emails = [pending_call(requester=second, name="send_email", agent_=mailer,
                           arguments={"to": f"client{i}@example.com", "subject": f"Contract {i}",
                                      "body": "Dear client,\n" + "terms " * 200},
                           expires_in=timedelta(hours=95 + i)).pk for i in range(EMAILS)]
    return {"soonest": soonest, "emails": emails, "runs": runs}


def _rows(page):
    return page.locator("#inbox-rows tr.inbox-item")


def _in_thread(function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a thread of its own, whose database connection is closed after."""
    def run():
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_150_items_sorted_filtered_paged_with_amounts_and_related_cues(waiting_items, served, browser):  # noqa: F811
    page = _context(browser, timezone_id="Asia/Kolkata").new_page()
    _log_in(page, served, "approver")
    page.goto(served + "/inbox/")  # again, now that the browser told its zone

    assert page.title() == "Inbox (150) · Tollgate"
    assert re.sub(r"\s+", " ", page.text_content("#nav-inbox")).strip() == "Inbox 150 approval"
    rows = _rows(page)
    assert rows.count() == 25
    # Expiring soonest by default: the two refunds of order 123 first, then expiry never goes down.
    ids = [int(rows.nth(i).get_attribute("data-interrupt-id")) for i in range(25)]
    assert ids[:2] == waiting_items["soonest"]
    keys = [int(rows.nth(i).get_attribute("data-k1")) for i in range(25)]
    assert keys == sorted(keys)
    first = rows.nth(0)
    assert first.get_attribute("data-urgency") == "urgent"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d IST", first.locator("td.expiry").get_attribute("title"))
    # Each row shows amount and order; the rule that fired; requester and agent.
    for i in range(25):
        text = rows.nth(i).locator("dl.risk").text_content()
        assert re.search(r"Amount\d+\.00", text) and re.search(r"Order\d+", text), text
    assert first.locator("td.rule").text_content().strip() == "sum(amount) per target > 50"
    assert first.locator(".summary").text_content() == "Refund 80.00 on order 123 (total 120.00, refunded 0.00)"
    # The related cue, on both items of order 123: together they ask more than is left.
    cues = page.locator("p.related.conflict")
    assert cues.count() == 2
    assert "1 other pending item on order 123: 2 pending refunds ask 150.00; only 120.00 refundable" in \
        cues.nth(0).text_content()
    assert page.locator("p.related").count() == 2

    # Page 2 exists, and continues the order.
    page.click("#next-page")
    page.wait_for_selector("#page-number:text-is('Page 2')")
    assert _rows(page).count() == 25
    assert int(_rows(page).nth(0).get_attribute("data-k1")) >= keys[-1]
    page.screenshot(path="/tmp/tollgate-inbox.png", full_page=True)

    # Filter by tool, then by requester.
    page.select_option("#id_tool", "send_email")
    page.click("#apply-filters")
    page.wait_for_url("**tool=send_email**")
    assert _rows(page).count() == EMAILS
    assert "Recipient" in _rows(page).nth(0).text_content()
    assert page.locator("#next-page").count() == 0
    page.select_option("#id_tool", "")
    page.fill("#id_requester", "buyer")
    page.click("#apply-filters")
    page.wait_for_url("**requester=buyer**")
    assert sorted(int(_rows(page).nth(i).get_attribute("data-interrupt-id")) for i in range(EMAILS)) == sorted(
        waiting_items["emails"])
    assert _rows(page).count() == EMAILS
    page.fill("#id_requester", "requester")
    page.select_option("#id_sort", "newest")
    page.click("#apply-filters")
    page.wait_for_url("**sort=newest**")
    assert _rows(page).count() == 25
    assert all(_rows(page).nth(i).locator(".requester").text_content() == "requester" for i in range(25))


def test_live_changes_patch_rows_without_reloading(waiting_items, served, browser):  # noqa: F811
    page = _context(browser).new_page()
    _log_in(page, served, "approver")
    page.evaluate("window.notReloaded = true")
    first_id = _rows(page).nth(0).get_attribute("data-interrupt-id")
    page.wait_for_selector("#inbox-list[data-live=on]")  # the socket is connected

    from approvals.models import Interrupt
    from runs.models import Run

    def cancel_first():
        run = Interrupt.objects.get(pk=waiting_items["soonest"][0]).run
        cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester")

    _in_thread(cancel_first)
    page.wait_for_selector(f'tr.inbox-item[data-interrupt-id="{first_id}"]', state="detached")
    expect(page).to_have_title("Inbox (149) · Tollgate")

    def new_item(order: int, expires_in: timedelta) -> int:
        from django.contrib.auth import get_user_model

        requester = get_user_model().objects.get(username="requester")
        return pending_call(requester=requester, arguments={"order_id": order, "amount": 99},
                            expires_in=expires_in).pk

    # Expiring in 30 minutes: it goes to the top of this page, which is the first.
    soon = _in_thread(new_item, 2100, timedelta(minutes=30))
    page.wait_for_selector(f'#inbox-rows tr.inbox-item:first-child[data-interrupt-id="{soon}"]')
    expect(page).to_have_title("Inbox (150) · Tollgate")
    assert "Refund 99.00 on order 2100" in _rows(page).nth(0).text_content()
    # Expiring in 100 hours it sorts after this page's last row: it belongs to a later page.
    later = _in_thread(new_item, 2101, timedelta(hours=100))
    expect(page).to_have_title("Inbox (151) · Tollgate")
    assert page.locator(f'tr.inbox-item[data-interrupt-id="{later}"]').count() == 0
    assert _rows(page).count() == 25
    assert page.evaluate("window.notReloaded") is True


def test_the_inbox_with_150_items_fits_a_phone(waiting_items, served, browser):  # noqa: F811
    page = _context(browser, viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=3).new_page()
    _log_in(page, served, "approver")
    for path in ["/inbox/", "/inbox/?tool=send_email"]:
        page.goto(served + path)
        assert _rows(page).count() > 0
        _assert_fits(page, path)
