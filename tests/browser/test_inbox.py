"""Real-browser test of the inbox list (issue 12, Prove 1): 150 waiting items in headless Chromium.

Against ``manage.py serve`` without the demo (``served_core``, tests/support/browser.py).
The items are made before the browser starts (``tests.support.core.pending_transfer``,
``tests.support.inbox``); the demo refunds' verdict on refunds together is tests/demo/test_inbox_cues.py.
changes made while the page is open run in a thread of their own, since
Django refuses ORM calls from the thread where Playwright's loop runs.
"""

import re
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connections
from playwright.sync_api import expect

from runs.engine.lifecycle import cancel_run
from tests.support.core import pending_transfer
from tests.support.inbox import agent, pending_call
from tests.support.browser import browser, served_core  # noqa: F401 (fixtures)
from tests.browser.test_i18n import PHONE, _assert_fits, _context, _log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TRANSFERS, LOOKUPS = 144, 6


@pytest.fixture
def waiting_items(people):
    """150 pending items: 144 transfers (two to acme, the first to expire; the rest one account each),
    6 lookups of another requester and agent, expiring last. Returns ``{"soonest": [ids], "lookups": [ids],
    "runs": [ids]}``."""
    from django.contrib.auth import get_user_model

    second = get_user_model().objects.create_user("buyer")
    soonest = [pending_transfer(requester=people["requester"], account="acme", amount=amount,
                                expires_in=timedelta(minutes=minutes)).pk
               for amount, minutes in ((80, 20), (70, 40))]
    runs = []
    for i in range(TRANSFERS - 2):
        item = pending_transfer(requester=people["requester"], account=f"acct-{2000 + i}", amount=51 + i % 40,
                                expires_in=timedelta(hours=2 + (i * 37) % 90), created_ago=timedelta(minutes=i))
        runs.append(item.run_id)
    looker = agent("looker")
    lookups = [pending_call(requester=second, name="fake_lookup", agent_=looker, rule="always",
                            arguments={"key": f"client{i}@example.com, contract {i}: " + "terms " * 10},
                            expires_in=timedelta(hours=95 + i)).pk for i in range(LOOKUPS)]
    return {"soonest": soonest, "lookups": lookups, "runs": runs}


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


def test_150_items_sorted_filtered_paged_with_amounts_and_related_cues(  # noqa: F811
        waiting_items, served_core, browser):
    page = _context(browser, timezone_id="Asia/Kolkata").new_page()
    _log_in(page, served_core, "approver")
    page.goto(served_core + "/inbox/")  # again, now that the browser told its zone

    assert page.title() == "Inbox (150) · Tollgate"
    assert re.sub(r"\s+", " ", page.text_content("#nav-inbox")).strip() == "Inbox 150 approval"
    rows = _rows(page)
    assert rows.count() == 25
    # Expiring soonest by default: the two transfers to acme first, then expiry never goes down.
    ids = [int(rows.nth(i).get_attribute("data-interrupt-id")) for i in range(25)]
    assert ids[:2] == waiting_items["soonest"]
    keys = [int(rows.nth(i).get_attribute("data-k1")) for i in range(25)]
    assert keys == sorted(keys)
    first = rows.nth(0)
    assert first.get_attribute("data-urgency") == "urgent"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d IST", first.locator("td.expiry").get_attribute("title"))
    # Each row shows amount and account; the rule that fired; requester and agent.
    for i in range(25):
        text = rows.nth(i).locator("dl.risk").text_content()
        assert re.search(r"amount\d+", text) and re.search(r"account(acme|acct-\d+)", text), text
    assert first.locator("td.rule").text_content().strip() == "amount > 10"
    assert first.locator(".summary").text_content() == "fake_transfer(account=acme, amount=80)"
    # The related cue, on both items to acme (fake_transfer gives no verdict on them together).
    cues = page.locator("p.related")
    assert cues.count() == 2
    assert cues.nth(0).text_content().strip() == "1 other pending item on account acme"

    # Page 2 exists, and continues the order.
    page.click("#next-page")
    page.wait_for_selector("#page-number:text-is('Page 2')")
    assert _rows(page).count() == 25
    assert int(_rows(page).nth(0).get_attribute("data-k1")) >= keys[-1]
    page.screenshot(path="/tmp/tollgate-inbox.png", full_page=True)

    # Filter by tool, then by requester.
    page.select_option("#id_tool", "fake_lookup")
    page.click("#apply-filters")
    page.wait_for_url("**tool=fake_lookup**")
    assert _rows(page).count() == LOOKUPS
    assert "key" in _rows(page).nth(0).locator("dl.risk").text_content()  # the lookup's field
    assert page.locator("#next-page").count() == 0
    page.select_option("#id_tool", "")
    page.fill("#id_requester", "buyer")
    page.click("#apply-filters")
    page.wait_for_url("**requester=buyer**")
    assert sorted(int(_rows(page).nth(i).get_attribute("data-interrupt-id")) for i in range(LOOKUPS)) == sorted(
        waiting_items["lookups"])
    assert _rows(page).count() == LOOKUPS
    page.fill("#id_requester", "requester")
    page.select_option("#id_sort", "newest")
    page.click("#apply-filters")
    page.wait_for_url("**sort=newest**")
    assert _rows(page).count() == 25
    assert all(_rows(page).nth(i).locator(".requester").text_content() == "requester" for i in range(25))


def test_live_changes_patch_rows_without_reloading(waiting_items, served_core, browser):  # noqa: F811
    page = _context(browser).new_page()
    _log_in(page, served_core, "approver")
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

    def new_item(account: str, expires_in: timedelta) -> int:
        from django.contrib.auth import get_user_model

        requester = get_user_model().objects.get(username="requester")
        return pending_transfer(requester=requester, account=account, amount=99, expires_in=expires_in).pk

    # Expiring in 30 minutes: it goes to the top of this page, which is the first.
    soon = _in_thread(new_item, "acct-2100", timedelta(minutes=30))
    page.wait_for_selector(f'#inbox-rows tr.inbox-item:first-child[data-interrupt-id="{soon}"]')
    expect(page).to_have_title("Inbox (150) · Tollgate")
    assert "fake_transfer(account=acct-2100, amount=99)" in _rows(page).nth(0).text_content()
    # Expiring in 100 hours it sorts after this page's last row: it belongs to a later page.
    later = _in_thread(new_item, "acct-2101", timedelta(hours=100))
    expect(page).to_have_title("Inbox (151) · Tollgate")
    assert page.locator(f'tr.inbox-item[data-interrupt-id="{later}"]').count() == 0
    assert _rows(page).count() == 25
    assert page.evaluate("window.notReloaded") is True


def test_the_inbox_with_150_items_fits_a_phone(waiting_items, served_core, browser):  # noqa: F811
    page = _context(browser, viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=3).new_page()
    _log_in(page, served_core, "approver")
    for path in ["/inbox/", "/inbox/?tool=fake_lookup"]:
        page.goto(served_core + path)
        assert _rows(page).count() > 0
        _assert_fits(page, path)
