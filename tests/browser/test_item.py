"""Real-browser tests of the inbox item page (issue 12, Prove 2, 3 and 8).

Headless Chromium against ``manage.py serve`` (``tests/support/browser.py``).
Everything the database must hold is made before the browser starts, and
afterwards the test reads only through HTTP (the pages, the REST API with a
token) and the transfers ``fake_transfer`` made: Django refuses ORM calls
from the thread where Playwright's event loop runs. The runs' tools run in
this process (the ``worker`` fixture; the server only serves).
"""

import re
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from rest_framework.authtoken.models import Token

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from runs.engine.lifecycle import start_run
from runs.sweeping import sweep
from runs.models import Run
from tests.support.api import start_run as api_start_run
from tests.support.browser import SCREENSHOT, browser, log_in, page_fits, served_core  # noqa: F401  (fixtures)
from tests.support.core import core_agent, transfer
from tests.support.fake_tools import transfers
from tests.support.web import unanswered_agent, unanswered_transfer, waiting_transfer  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AMOUNT_60_TO_40 = [{"path": "/amount", "field": "amount", "change": "changed", "proposed": 60, "approved": 40}]
COMMENT = "Only the broken part: 40."


@pytest.fixture
def transfer_60(people, worker, api):
    """A run waiting for approval of a transfer of 60.00 to acme: ``(run id, item id, approver's API token)``."""
    agent = core_agent(api(people["admin"]), "send-sixty", [
        {"content": "Acme sent back half of the parts; transferring 60.00.", "tool_calls": [transfer("acme", 60)]},
        {"content": "Transferred."}])
    run = api_start_run(api(people["requester"]), agent["slug"], "Pay acme back for the returned parts.")
    worker.drain()
    token, _ = Token.objects.get_or_create(user=people["approver"])
    return run["id"], Interrupt.objects.get(run_id=run["id"]).pk, token.key


def _api(base: str, token: str, path: str) -> dict:
    response = httpx.get(base + path, headers={"Authorization": f"Token {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def _shows_60_to_40(locator) -> None:
    change = locator.locator('.change[data-path="/amount"]')
    assert change.count() == 1
    assert change.locator("del.proposed").text_content() == "60"
    assert change.locator("ins.approved").text_content() == "40"


def test_edit_60_to_40_charges_40_and_every_surface_shows_60_to_40_with_the_comment(
        transfer_60, worker, served_core, browser):  # noqa: F811
    run_id, item_id, token = transfer_60
    page = log_in(browser, served_core, "approver", "approver-demo")
    page.goto(f"{served_core}/inbox/{item_id}/")
    assert "fake_transfer(account=acme, amount=60)" in page.text_content("#summary-text")
    assert "amount > 10" in page.text_content("#why-rule")
    assert page.text_content("#why-reason").strip() == "Acme sent back half of the parts; transferring 60.00."
    assert page.text_content("#tool-arguments [data-name=amount]").strip() == "60"

    page.click("#edit-arguments summary")
    page.fill("#id_edited_arguments", '{"account": "acme", "amount": 40}')
    page.fill("#id_comment", COMMENT)
    page.click("#approve")
    page.wait_for_url(f"{served_core}/runs/{run_id}/")
    worker.drain()
    page.wait_for_selector("#run-status[data-status=completed]")

    # The transfer made is what the approver approved, not what the model proposed.
    assert [Decimal(str(made["amount"])) for made in transfers()] == [Decimal("40")]

    # The run page: the decision with who, the comment and 60 → 40; the timeline's event likewise.
    page.reload()
    decision = page.locator(f'#decisions .decided-item[data-interrupt-id="{item_id}"]')
    assert "decided by approver" in decision.text_content()
    assert decision.locator(".decision-comment").text_content() == COMMENT
    _shows_60_to_40(decision)
    event = page.locator("#timeline tr.event.type-interrupt", has=page.locator(".change"))
    assert event.count() == 1
    _shows_60_to_40(event)
    assert event.locator(".event-comment").text_content() == COMMENT
    page.screenshot(path=str(SCREENSHOT.with_name("tollgate-run-edited.png")), full_page=True)

    # The item page keeps the proposed arguments and shows the change beside who decided.
    page.goto(f"{served_core}/inbox/{item_id}/")
    assert page.text_content("#tool-arguments [data-name=amount]").strip() == "60"
    _shows_60_to_40(page.locator("#item-state"))
    assert page.locator("#item-state .decision-comment").text_content() == COMMENT

    # The API: the run's decisions, the item, the event.
    decision, = _api(served_core, token, f"/api/runs/{run_id}/")["decisions"]
    assert (decision["decided_by"], decision["comment"], decision["changes"]) == ("approver", COMMENT, AMOUNT_60_TO_40)
    item = _api(served_core, token, f"/api/interrupts/{item_id}/")
    assert item["proposed_arguments"]["amount"] == 60 and item["edited_arguments"]["amount"] == 40
    assert item["changes"] == AMOUNT_60_TO_40
    resolved, = [e for e in _api(served_core, token, f"/api/runs/{run_id}/events/")["results"]
                 if e["type"] == "interrupt" and e["to_status"] == "resolved"]
    assert resolved["payload"]["changes"] == AMOUNT_60_TO_40

    # At phone width the item page with its changes does not scroll sideways.
    phone = log_in(browser, served_core, "approver", "approver-demo", width=390, height=844)
    for path in [f"/inbox/{item_id}/", f"/runs/{run_id}/"]:
        phone.goto(served_core + path)
        assert page_fits(phone), path
    phone.goto(f"{served_core}/inbox/{item_id}/")
    phone.screenshot(path=str(SCREENSHOT.with_name("tollgate-item-edited-phone.png")), full_page=True)


@pytest.fixture
def waiting_transfer_run(people, worker):
    """A transfer run waiting for approval: ``(run id, item id)``."""
    run = waiting_transfer(people, worker)
    return run.pk, Interrupt.objects.get(run=run).pk


def test_item_decided_in_another_browser_shows_who_decided_within_2_s_without_reload(
        waiting_transfer_run, worker, served_core, browser):  # noqa: F811
    run_id, item_id = waiting_transfer_run
    url = f"{served_core}/inbox/{item_id}/"
    watcher = log_in(browser, served_core, "admin", "admin-demo")  # may decide it too
    watcher.goto(url)
    watcher.wait_for_selector("#decision-form")
    watcher.fill("#id_comment", "I was about to approve this")
    watcher.evaluate("window.notReloaded = true")

    approver = log_in(browser, served_core, "approver", "approver-demo")
    approver.goto(url)
    approver.fill("#id_comment", "Checked the photos.")
    with approver.expect_response(lambda r: r.request.method == "POST" and r.url == url) as posted:
        approver.click("#approve")
    assert posted.value.status == 302  # decided and committed: from here the other page has 2 s

    watcher.wait_for_selector("#item-state[data-status=resolved]", timeout=2_000)
    resolution = watcher.text_content("#item-resolution")
    assert "decided by approver" in resolution and "Checked the photos." in resolution
    assert watcher.query_selector("#decision-form") is None
    assert watcher.get_attribute("#item-status", "data-status") == "resolved"
    assert watcher.evaluate("window.notReloaded") is True
    worker.drain()


@pytest.fixture
def reconciliation_item(people, worker, unanswered_transfer, settings):
    """A transfer whose outcome the bank never confirmed, handed to a person: ``(run id, item id, key, error)``.

    The bank fails every transfer before committing, so the call ends
    ``unknown`` and the tool's reconcile hook finds nothing twice
    (``RECONCILE_MAX_TRIES``).
    """
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 2}
    run = start_run(agent=unanswered_agent(), user=people["requester"], input="send 30 to acme")
    worker.drain()
    run.refresh_from_db()
    assert run.wake_at is not None  # the hook tried once and will try again
    assert sweep(now=run.wake_at + timedelta(seconds=1))["woken"] == 1
    worker.drain()
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION, status=InterruptStatus.PENDING)
    call = item.tool_call
    assert call.idempotency_key and call.error and Run.objects.get(pk=run.pk).status == "waiting"
    return run.pk, item.pk, call.idempotency_key, call.error, call.attempts


def test_reconciliation_item_shows_key_and_error_and_the_run_page_no_dangling_expiry(
        reconciliation_item, served_core, browser):  # noqa: F811
    run_id, item_id, key, error, attempts = reconciliation_item
    page = log_in(browser, served_core, "approver", "approver-demo")
    page.goto(f"{served_core}/inbox/{item_id}/")
    assert page.text_content("#lookup-what .idempotency-key") == key  # "look up the call with key K ..."
    assert page.text_content("#lookup-error").strip() == error
    assert page.text_content("#lookup-attempts").strip() == str(attempts)
    assert page.text_content("#lookup-checks").strip() == "2"
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page.text_content("#lookup-last-check"))
    assert page.query_selector("#reconcile-succeeded") is not None
    page.screenshot(path=str(SCREENSHOT.with_name("tollgate-item-reconciliation.png")), full_page=True)

    page.goto(f"{served_core}/runs/{run_id}/")
    pending = page.text_content("#pending-items")
    assert "does not expire" in pending and "expires in" not in pending
    assert not re.search(r"expires in\s*$", page.text_content("body"), re.M)

    phone = log_in(browser, served_core, "approver", "approver-demo", width=390, height=844)
    for path in [f"/inbox/{item_id}/", f"/runs/{run_id}/"]:
        phone.goto(served_core + path)
        assert page_fits(phone), path
