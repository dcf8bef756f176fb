"""The bulk pages in a real browser with the demo's refunds: the warning from their verdict on refunds together.

Headless Chromium against ``manage.py serve`` with the demo (``served``, tests/support/browser.py); the refunds go
to the test payment gateway and the worker of this process runs them. Bulk decisions without the demo are
tests/browser/test_bulk.py.
"""

import pytest

from approvals.models import Interrupt
from tests.support.browser import browser, log_in, served  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


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
