"""Screenshots of the inbox, an inbox item and a run page, taken in headless Chromium at 1280×900.

With a small realistic shop (four refunds waiting for approval on
different orders, one refund approved and completed), the approver's
view of each page is saved as a PNG in ``TOLLGATE_SCREENSHOTS`` (a
directory; default: the test's own temporary directory, so the suite
never writes into the repository), after checking that the page shows
what it is about. README.md's screenshots in ``docs/screenshots/`` are
made by this test (README "Screenshots").
"""

import os
from pathlib import Path

import pytest

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.engine.agents import create_agent
from runs.engine.lifecycle import start_run
from runs.models import Agent, RunStatus
from tests.support.browser import TIMEOUT_MS, browser, served  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1280, "height": 900}
# (order, amount, what the requester wrote): each over the refund tool's 50.00, so each waits for approval.
WAITING_REFUNDS = [
    (103, 60, "The blender from order 103 stopped working after two days; please refund 60.00."),
    (109, 75, "Order 109 arrived without the charger. I'd like 75.00 back."),
    (111, 90, "Two of the three chairs in order 111 were scratched, refund 90.00 please."),
    (101, 55, "Order 101 was delivered a week late; we agreed on 55.00 back."),
]


def screenshot_dir(tmp_path: Path) -> Path:
    """Where the PNGs go: ``TOLLGATE_SCREENSHOTS`` if set, else ``tmp_path``."""
    directory = Path(os.environ.get("TOLLGATE_SCREENSHOTS") or tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _refund_agent(order: int, amount: int) -> Agent:
    return create_agent(
        slug=f"refund-order-{order}", name=f"Refund order {order}", completion_check="refund",
        instructions="Help the customer get a refund. Check the order first.", tools=["query_order", "refund"],
        model={"provider": "scripted", "turns": [
            {"tool_calls": [{"name": "query_order", "arguments": {"order_id": order}}]},
            {"tool_calls": [{"name": "refund", "arguments": {"order_id": order, "amount": amount}}]},
            {"content": f"A refund of {amount:.2f} for order {order} has been issued."},
        ]})


@pytest.fixture
def shop(demo, worker):
    """The data the screenshots show: ``{"completed": run, "items": [inbox items waiting, oldest first]}``.

    Made before the browser starts (Django refuses ORM calls from
    Playwright's thread).
    """
    completed = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"],
                          input="Please refund 80.00 on order 123, it arrived damaged.")
    worker.drain()
    decide_interrupt(interrupt=completed.interrupts.get(), user=demo["approver"], decision="approved",
                     comment="Photos of the damage attached to the ticket; OK.")
    for order, amount, text in WAITING_REFUNDS:
        start_run(agent=_refund_agent(order, amount), user=demo["requester"], input=text)
    worker.drain()
    completed.refresh_from_db()
    assert completed.status == RunStatus.COMPLETED
    items = list(Interrupt.objects.filter(status="pending").select_related("tool_call").order_by("created_at", "pk"))
    assert len(items) == len(WAITING_REFUNDS)
    return {"completed": completed, "items": items}


def test_screenshots_of_inbox_item_and_run_pages(shop, served, browser, tmp_path):  # noqa: F811
    directory = screenshot_dir(tmp_path)
    context = browser.new_context(viewport=VIEWPORT, extra_http_headers={"Accept-Language": "en"})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto(served + "/accounts/login/")
    page.fill("#id_username", "approver")
    page.fill("#id_password", "approver-demo")
    page.click("#login")
    page.wait_for_url(served + "/inbox/")

    for item in shop["items"]:  # every waiting refund is listed, with a way to open it
        assert page.locator(f'a[href="/inbox/{item.pk}/"]').count() >= 1, item
    assert page.text_content("h1").startswith("Inbox")
    page.screenshot(path=str(directory / "inbox.png"))

    # The runs were in flight together: their items arrived in any order. The one on order 103:
    item = next(item for item in shop["items"] if item.tool_call.arguments["order_id"] == 103)
    page.goto(f"{served}/inbox/{item.pk}/")
    body = page.text_content("main")
    assert "refund" in body and "103" in body and "60" in body
    assert page.locator("#approve").is_visible()
    page.screenshot(path=str(directory / "item.png"))

    run = shop["completed"]
    page.goto(f"{served}/runs/{run.pk}/")
    page.wait_for_selector("#run-status[data-status=completed]")
    assert "A refund of 80.00 for order 123 has been issued." in page.text_content("#run-final-output")
    assert "approved" in page.text_content("#timeline")
    page.screenshot(path=str(directory / "run.png"))

    for name in ("inbox", "item", "run"):
        png = (directory / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert (width, height) == (VIEWPORT["width"], VIEWPORT["height"]), name
