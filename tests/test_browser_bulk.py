"""Issue 12, Prove 4, in a real browser: bulk-approve after a confirmation page; a run cancelled meanwhile is skipped.

Headless Chromium against ``manage.py serve`` (the fixtures of tests/test_browser.py);
the refunds go to the test payment gateway and the worker of this process runs them.
"""

import pytest

from approvals.models import Interrupt
from runs.engine.lifecycle import cancel_run
from runs.models import RunEvent, RunStatus
from tests.browser_helpers import browser, log_in, served  # noqa: F401 (fixtures)
from tests.workflow_helpers import refund_items

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
