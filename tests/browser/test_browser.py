"""Real-browser test: headless Chromium against a real ``manage.py serve``.

The app is served_core the way users run it: ``manage.py serve`` in a
subprocess (Daphne: HTTP, WebSockets, static files) pointed at the test
database (``DATABASE_URL`` rewritten to the test database's name; the same
``REDIS_URL``). In the embedded shape that process runs its own in-process
worker; with Redis the ``worker`` fixture of this process consumes the
shared queue and publishes live updates through the shared Redis channel
layer. Either way the browser sees the run move live.
"""

import pytest

from tests.support.browser import SCREENSHOT, boxes, browser, log_in, served_core  # noqa: F401  (fixtures)
from tests.support.core import asking_agent, core_agent, transfer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
# How the run page marks a final text the records differ from.
MARK = "the records differ from a plain success: check it against them"
# What the model of ``claim_run`` says at the end, whatever happened.
SENT_CLAIM = "The transfer to acme has been made."


@pytest.fixture
def send_80(people):
    """The agent ``send-80`` (``tests.support.core.asking_agent``: looks acme up, transfers 80 to it, which asks a
    person), made before the browser starts."""
    return asking_agent()

def test_requester_starts_transfer_approver_approves_in_inbox_run_completes_live(send_80, worker, served_core, browser):
    # The requester starts a transfer through the form and watches the run page.
    requester = log_in(browser, served_core, "requester", "requester-demo")
    requester.click("#nav-start")
    requester.select_option("#id_agent", "send-80")
    requester.fill("#id_input", "Please send 80.00 to acme for the returned parts.")
    requester.click("#start")
    requester.wait_for_url("**/runs/*/")
    run_id = requester.get_attribute("#run", "data-run-id")
    worker.drain()  # Redis shape: this process's worker; embedded: the server's own worker
    requester.wait_for_selector("#run-status[data-status=waiting]")
    requester.wait_for_selector("#live-indicator.on")  # the WebSocket is connected
    assert requester.text_content("#run-waiting-reason").strip() == "approval"

    # The approver finds it in the inbox, reads the arguments, approves.
    approver = log_in(browser, served_core, "approver", "approver-demo")
    row = approver.locator(".inbox-item", has_text=f"run {run_id}")
    assert row.count() == 1
    assert "fake_transfer" in row.text_content()
    approver_item_id = row.get_attribute("data-interrupt-id")
    row.locator("a.open-item").click()
    approver.wait_for_selector("#tool-arguments")
    assert approver.text_content("#tool-name") == "fake_transfer"
    assert approver.text_content("#tool-arguments [data-name=account]").strip() == "acme"
    assert approver.text_content("#tool-arguments [data-name=amount]").strip() == "80"
    assert "fake_lookup" in approver.text_content("#prior-tool-results")
    approver.fill("#id_comment", "Parts returned, OK.")
    approver.screenshot(path=str(SCREENSHOT.with_name("tollgate-item.png")), full_page=True)
    approver.click("#approve")
    approver.wait_for_url(f"{served_core}/runs/{run_id}/")
    worker.drain()

    approver.wait_for_selector("#run-status[data-status=completed]")
    # The requester's page got there by itself (WebSocket, or the polling fallback).
    requester.wait_for_selector("#run-status[data-status=completed]")
    requester.wait_for_selector("#run-final-output")
    assert "Sent 80." in requester.text_content("#run-final-output")
    assert "completed" in requester.text_content("#timeline")
    approver.reload()
    assert approver.text_content("#run-outcome .run-outcome").strip() == "achieved"
    approver.screenshot(path=str(SCREENSHOT), full_page=True)

    # The item is resolved: no decision buttons any more, and who decided is shown.
    item_url = f"{served_core}/inbox/{approver_item_id}/"
    approver.goto(item_url)
    assert approver.get_attribute("#item-status", "data-status") == "resolved"
    assert approver.query_selector("#approve") is None
    resolution = approver.text_content("#item-resolution")
    assert "Approved" in resolution and "decided by approver" in resolution and "Parts returned, OK." in resolution


def test_the_status_badge_changes_with_the_tool_calls_never_before_them(send_80, worker, served_core, browser):
    requester = log_in(browser, served_core, "requester", "requester-demo")
    requester.click("#nav-start")
    requester.select_option("#id_agent", "send-80")
    requester.fill("#id_input", "Please send 80.00 to acme for the returned parts.")
    requester.click("#start")
    requester.wait_for_url("**/runs/*/")
    run_id = requester.get_attribute("#run", "data-run-id")
    worker.drain()
    requester.wait_for_selector("#run-status[data-status=waiting]")
    requester.wait_for_selector("#live-indicator.on")
    # The page's re-render (what a new status asks for) is held until the run has ended.
    held = []
    requester.route(f"{served_core}/runs/{run_id}/", lambda route: held.append(route)
                    if route.request.headers.get("x-requested-with") == "fetch" else route.continue_())

    approver = log_in(browser, served_core, "approver", "approver-demo")
    approver.goto(f"{served_core}/inbox/")
    approver.locator(".inbox-item", has_text=f"run {run_id}").locator("a.open-item").click()
    approver.click("#approve")
    approver.wait_for_url(f"{served_core}/runs/{run_id}/")
    worker.drain()
    approver.wait_for_selector("#run-status[data-status=completed]")  # the run has ended
    for _ in range(100):  # the pushes reach the requester's page, which asks for its re-render
        if held:
            break
        requester.wait_for_timeout(100)
    assert held, "the page never asked to be re-rendered"
    requester.wait_for_timeout(1000)  # every push of the run's end has arrived meanwhile
    # Until the re-render arrives, the badge shows what the rest of the section shows.
    assert requester.get_attribute("#run-status", "data-status") == "waiting"
    assert requester.get_attribute("#run", "data-status") == "waiting"
    while held:
        held.pop().continue_()
    requester.wait_for_selector("#run-status[data-status=completed]")
    statuses = requester.eval_on_selector_all(".tool-call-row", "rows => rows.map(row => row.dataset.status)")
    assert statuses and set(statuses) == {"succeeded"}, statuses


@pytest.fixture
def denied_transfer_run(people, worker, api):
    """A finished run whose transfer was denied while the model claimed success (set up before the browser starts)."""
    from tests.support.api import start_run

    agent = core_agent(api(people["admin"]), "claims-transfer", [
        {"tool_calls": [transfer("acme", 500)]}, {"content": "Transfer made."}], completion_check="default")
    run = start_run(api(people["requester"]), agent["slug"], "Send 500 to acme.")
    worker.drain()
    return run["id"]


def test_run_page_shows_not_achieved_beside_the_models_claim(denied_transfer_run, served_core, browser):
    page = log_in(browser, served_core, "requester", "requester-demo")
    page.goto(f"{served_core}/runs/{denied_transfer_run}/")
    page.wait_for_selector("#run-status[data-status=completed]")
    assert page.text_content("#run-final-output").strip() == "Transfer made."
    verdict = page.text_content("#run-verdict")
    assert "not achieved" in verdict
    assert "denied" in verdict and "at most 100.00 more can be transferred" in verdict
    # The verdict sits right above the model's words, not somewhere else on the page.
    verdict_box, words_box = boxes(page, "#run-verdict", "#run-final-output")
    assert 0 <= words_box["y"] - (verdict_box["y"] + verdict_box["height"]) < 60


@pytest.fixture
def claim_run(people, worker, api):
    """A run waiting for its transfer's approval whose model will say the transfer was made, whatever happened
    (``SENT_CLAIM``; set up before the browser starts)."""
    from tests.support.api import get_run, start_run

    agent = core_agent(api(people["admin"]), "claims-transfer", [
        {"tool_calls": [transfer("acme", 80)]}, {"content": SENT_CLAIM}])
    run = start_run(api(people["requester"]), agent["slug"], "Send 80 to acme.")
    worker.drain()
    run = get_run(api(people["requester"]), run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "approval")
    return run["id"]


def test_a_rejected_transfers_run_page_shows_the_sent_claim_as_contradicted_beside_the_facts(
        claim_run, worker, served_core, browser):
    requester = log_in(browser, served_core, "requester", "requester-demo")
    requester.goto(f"{served_core}/runs/{claim_run}/")
    requester.wait_for_selector("#run-status[data-status=waiting]")
    assert requester.locator("#run-final").count() == 0

    approver = log_in(browser, served_core, "approver", "approver-demo")
    approver.locator(".inbox-item", has_text=f"run {claim_run}").locator("a.open-item").click()
    approver.wait_for_selector("#tool-arguments")
    approver.fill("#id_comment", "Acme's account is under review.")
    approver.click("#reject")
    approver.wait_for_url(f"{served_core}/runs/{claim_run}/")
    worker.drain()

    # The requester's page re-renders by itself: the model's words come as its claim, marked, beside the facts.
    requester.wait_for_selector("#run-status[data-status=completed]")
    requester.wait_for_selector("#run-final[data-final-output-status=contradicted]")
    assert requester.text_content("#run-final-status").strip() == MARK
    assert requester.text_content("#run-final-output").strip() == SENT_CLAIM
    assert "not achieved" in requester.text_content("#run-verdict")
    facts = requester.locator("#run-facts li.fact")
    assert facts.evaluate_all("items => items.map(item => item.dataset.code)") == [
        "outcome_not_achieved", "call_without_effect"]
    rejected = facts.nth(1).text_content()
    assert "fake_transfer" in rejected and "rejected" in rejected and "Acme's account is under review." in rejected
    # Side by side: the facts start level with the claim, to its right.
    claim_box, facts_box = boxes(requester, "#run-final-output", "#run-facts")
    assert facts_box["x"] >= claim_box["x"] + claim_box["width"]
    assert abs(facts_box["y"] - claim_box["y"]) < 5
    requester.screenshot(path=str(SCREENSHOT.with_name("tollgate-claim.png")), full_page=True)


def test_api_docs_render_every_operation_under_the_csp_from_this_site_only(people, served_core, browser):
    page = log_in(browser, served_core, "requester", "requester-demo")
    requests, complaints = [], []
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda message: complaints.append(message.text) if message.type == "error" else None)

    page.goto(f"{served_core}/api/docs/")
    page.wait_for_selector(".opblock-summary-path")

    paths = {element.text_content().replace("\u200b", "") for element in page.query_selector_all(
        ".opblock-summary-path")}
    assert {"/api/runs/", "/api/sessions/{id}/messages/", "/api/interrupts/{id}/approve/"} <= paths
    assert complaints == [], "no CSP violation or failed load"
    assert requests and all(url.startswith(served_core + "/") or url.startswith("data:") for url in requests), requests
