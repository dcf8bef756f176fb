"""Issue 12, Prove 4, in a real browser: bulk-approve after a confirmation page; a run cancelled meanwhile is skipped.

Headless Chromium against ``manage.py serve`` without the demo (``served_core``, tests/support/browser.py);
the transfers are ``fake_transfer``'s and the worker of this process runs them. The bulk pages' warning from the
demo refunds' verdict on refunds together is tests/demo/test_browser_bulk.py.
"""

import pytest

from approvals.models import Interrupt
from runs.engine.lifecycle import cancel_run
from runs.models import RunEvent, RunStatus
from tests.support.browser import browser, log_in, served_core  # noqa: F401 (fixtures)
from tests.support.core import transfer_items
from tests.support.fake_tools import transfers

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def six_transfers(people, worker, api):
    """Six pending transfers of 55.00 to six accounts, set up before the browser starts."""
    return transfer_items(api, people, worker, accounts=[f"acct-{n}" for n in range(1, 7)])


def test_bulk_approve_five_after_a_confirmation_page_and_skip_the_cancelled_one(
        six_transfers, people, worker, served_core, browser, monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the ORM calls below are plain blocking ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    approver = log_in(browser, served_core, "approver", "approver-demo")
    for item in six_transfers:
        approver.check(f'input.bulk-select[value="{item.pk}"]')
    approver.click("#bulk-decide")
    approver.wait_for_selector("#bulk-confirm-form")
    assert approver.locator(".bulk-item").count() == 6
    assert '"amount": 55' in approver.text_content(f'.bulk-item[data-interrupt-id="{six_transfers[3].pk}"]')
    assert transfers() == []  # the confirmation page decided nothing

    cancelled = six_transfers[3]
    cancel_run(run=cancelled.run, actor="user:requester")  # while the approver reads the page
    approver.fill("#id_comment", "Checked in a batch.")
    approver.click("#bulk-approve")
    approver.wait_for_selector("#bulk-decided-count")
    worker.drain()

    assert approver.locator(".bulk-decided").count() == 5
    skipped = approver.locator(".bulk-skipped")
    assert skipped.count() == 1 and skipped.get_attribute("data-interrupt-id") == str(cancelled.pk)
    assert "its run was cancelled" in skipped.text_content()

    approved = [item for item in six_transfers if item is not cancelled]
    assert sorted(made["account"] for made in transfers()) == sorted(
        item.tool_call.arguments["account"] for item in approved)
    for item in approved:
        item.refresh_from_db()
        item.run.refresh_from_db()
        assert (item.decision, item.comment, item.resolved_by) == ("approved", "Checked in a batch.", people["approver"])
        assert item.run.status == RunStatus.COMPLETED
    assert RunEvent.objects.filter(type="interrupt", actor="user:approver", reason="approved").count() == 5
    assert Interrupt.objects.get(pk=cancelled.pk).status == "cancelled"
