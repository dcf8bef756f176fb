"""Issue 12, Prove 4, in a real browser: bulk-approve after a confirmation page; a run cancelled meanwhile is skipped.

Headless Chromium against ``manage.py serve`` (the fixtures of tests/browser/test_browser.py);
the refunds go to the test payment gateway and the worker of this process runs them.
"""

import pytest

from approvals.models import Interrupt
from runs.engine.lifecycle import cancel_run
from runs.models import RunEvent, RunStatus
from tests.support.browser import browser, log_in, served  # noqa: F401 (fixtures)
from tests.support.workflow import refund_items

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def six_refunds(demo, worker, api, payment_gateway):
    """Six pending refunds of 55.00 on six demo orders, set up before the browser starts."""
    return refund_items(api, demo, worker)


def test_bulk_approve_five_after_a_confirmation_page_and_skip_the_cancelled_one(
        six_refunds, demo, worker, payment_gateway, served, browser, monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the ORM calls below are plain blocking ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    approver = log_in(browser, served, "approver", "approver-demo")
    for item in six_refunds:
        approver.check(f'input.bulk-select[value="{item.pk}"]')
    approver.click("#bulk-decide")
    approver.wait_for_selector("#bulk-confirm-form")
    assert approver.locator(".bulk-item").count() == 6
    assert '"amount": 55' in approver.text_content(f'.bulk-item[data-interrupt-id="{six_refunds[3].pk}"]')
    assert payment_gateway.ledger()["refunds"] == []  # the confirmation page decided nothing

    cancelled = six_refunds[3]
    cancel_run(run=cancelled.run, actor="user:requester")  # while the approver reads the page
    approver.fill("#id_comment", "Checked in a batch.")
    approver.click("#bulk-approve")
    approver.wait_for_selector("#bulk-decided-count")
    worker.drain()

    assert approver.locator(".bulk-decided").count() == 5
    skipped = approver.locator(".bulk-skipped")
    assert skipped.count() == 1 and skipped.get_attribute("data-interrupt-id") == str(cancelled.pk)
    assert "its run was cancelled" in skipped.text_content()

    approved = [item for item in six_refunds if item is not cancelled]
    assert sorted(r["order_id"] for r in payment_gateway.ledger()["refunds"]) == sorted(
        item.tool_call.arguments["order_id"] for item in approved)
    for item in approved:
        item.refresh_from_db()
        item.run.refresh_from_db()
        assert (item.decision, item.comment, item.resolved_by) == ("approved", "Checked in a batch.", demo["approver"])
        assert item.run.status == RunStatus.COMPLETED
    assert RunEvent.objects.filter(type="interrupt", actor="user:approver", reason="approved").count() == 5
    assert Interrupt.objects.get(pk=cancelled.pk).status == "cancelled"


@pytest.fixture
def three_refunds_on_one_order(demo, worker):
    """Three pending refunds of 80.00 on order 123 (total 120.00), each in its own run and session."""
    from runs.engine.lifecycle import start_run
    from tests.support.durability import make_agent

    agent = make_agent("refund-80", [{"tool_calls": [{"name": "refund", "arguments": {"order_id": 123, "amount": 80}}]},
                                     {"content": "Done."}], tools=["refund"], check="refund")
    runs = [start_run(agent=agent, user=demo["requester"], input=f"refund 123, try {n}") for n in range(3)]
    worker.drain()
    return list(Interrupt.objects.filter(run__in=runs).order_by("pk"))


def test_bulk_pages_warn_item_by_item_and_show_each_real_outcome_live(
        three_refunds_on_one_order, demo, worker, payment_gateway, served, browser, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    items = three_refunds_on_one_order
    approver = log_in(browser, served, "approver", "approver-demo")
    for item in items:
        approver.check(f'input.bulk-select[value="{item.pk}"]')
    approver.click("#bulk-decide")
    approver.wait_for_selector("#bulk-confirm-form")
    assert "Not all of these can succeed" in approver.text_content("#bulk-conflicts")
    for item in items:
        note = approver.locator(f'.bulk-item[data-interrupt-id="{item.pk}"] p.related.conflict')
        assert "not all can be paid" in note.text_content()

    approver.fill("#id_comment", "All three.")
    approver.click("#bulk-approve")
    approver.wait_for_selector("#bulk-outcomes")
    assert approver.locator(".bulk-outcome").count() == 3
    worker.drain()  # the runs go on while the page is open; the page follows by itself
    approver.wait_for_function(
        "() => document.querySelectorAll('.bulk-outcome[data-settled=\"true\"]').length === 3", timeout=30_000)
    statuses = approver.eval_on_selector_all(".bulk-outcome", "rows => rows.map(row => row.dataset.callStatus)")
    assert sorted(statuses) == ["denied", "denied", "succeeded"]
    denied = approver.locator('.bulk-outcome[data-call-status="denied"] .bulk-outcome-detail')
    assert all("at most 40.00 can be refunded" in denied.nth(n).text_content() for n in range(2))
    assert [r["amount"] for r in payment_gateway.ledger()["refunds"]] == ["80.00"]
