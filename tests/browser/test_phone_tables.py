"""Real-browser test (issue 27): on a 390 px wide phone, every list keeps its column names and shows amounts whole.

Headless Chromium at 390×844 against ``manage.py serve`` without the demo (``served_core``, tests/support/browser.py),
in English and Chinese. The lists (inbox, decided history, run list, a run's
tool calls and timeline, the bulk confirmation and result pages) stack each
row as a card: every shown cell has its column's name (``data-label``, drawn
by CSS before the value), no cell is wider than its box or the screen, and
each amount's text lies whole inside every box that could clip it.
"""

import json

import pytest

from approvals.services import decide_interrupt
from runs.models import Run
from tests.support.browser import browser, served_core  # noqa: F401 (fixtures)
from tests.support.core import pending_transfer
from tests.browser.test_i18n import PHONE, _assert_fits, _context, _log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

INPUT = "Please send 80.00 to acme for the returned parts."
AMOUNT = "amount=80"  # how an item names its transfer's amount (``fake_transfer(account=acme, amount=80)``)

# Every shown cell of the tables under ``selector``: its label, the label CSS draws, and whether it fits.
CELLS = """selector => [...document.querySelectorAll(selector)].filter(td => getComputedStyle(td).display !== "none")
  .map(td => { const before = getComputedStyle(td, "::before"), box = td.getBoundingClientRect();
    return {label: td.dataset.label || "", drawn: before.content, display: before.display,
            visibility: before.visibility, size: parseFloat(before.fontSize), color: before.color,
            scroll: td.scrollWidth, client: td.clientWidth, left: box.left, right: box.right,
            text: td.innerText.trim().slice(0, 40)}; })"""

# Each occurrence of ``needle`` in the page's tables: where its text is drawn, and whether a box around it cuts it.
AMOUNTS = """needle => { const found = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, at = node.data.indexOf(needle);
    if (at < 0 || !node.parentElement.closest("table.list")) continue;
    const range = document.createRange(); range.setStart(node, at); range.setEnd(node, at + needle.length);
    const box = range.getBoundingClientRect(), cut = [];
    for (let el = node.parentElement; el && el !== document.documentElement; el = el.parentElement) {
      const style = getComputedStyle(el);
      if (style.overflowX === "visible" && style.overflowY === "visible") continue;
      const outer = el.getBoundingClientRect();
      if (box.left < outer.left - 0.5 || box.right > outer.right + 0.5 || box.top < outer.top - 0.5
          || box.bottom > outer.bottom + 0.5 || el.scrollWidth > el.clientWidth) cut.push(el.tagName + "." + el.className);
    }
    found.push({text: node.data.trim().slice(0, 60), lines: range.getClientRects().length, left: box.left,
                right: box.right, width: box.width, cut});
  }
  return found; }"""


@pytest.fixture
def lists(people):
    """Two pending transfers of 80 to acme and a rejected one, each in its own run; made before the browser."""
    pending = [pending_transfer(requester=people["requester"]) for _ in range(2)]
    decided = pending_transfer(requester=people["requester"])
    decide_interrupt(interrupt=decided, user=people["approver"], decision="rejected", comment="The same transfer twice.")
    Run.objects.filter(interrupts__in=[*pending, decided]).update(input=INPUT)
    return {"pending": pending, "decided": decided}


def _assert_cards(page, selector: str, what: str) -> int:
    cells = page.evaluate(CELLS, selector)
    assert cells, f"{what}: no cells"
    for cell in cells:
        where = f"{what}: {cell}"
        assert cell["label"].strip(), where  # every shown cell names its column
        assert cell["drawn"] == json.dumps(cell["label"], ensure_ascii=False), where  # ... and CSS draws that name
        assert cell["display"] != "none" and cell["visibility"] == "visible" and cell["size"] >= 10, where
        assert cell["color"] not in ("transparent", "rgba(0, 0, 0, 0)"), where
        assert cell["scroll"] <= cell["client"], where  # nothing in the cell (its label included) is cut
        assert 0 <= cell["left"] and cell["right"] <= PHONE["width"], where
    return len(cells)


def _assert_amounts_whole(page, needle: str, what: str) -> int:
    found = page.evaluate(AMOUNTS, needle)
    assert found, f"{what}: no {needle!r} in a list"
    for amount in found:
        where = f"{what}: {amount}"
        assert amount["lines"] == 1 and amount["width"] > 0, where  # on one line, drawn
        assert 0 <= amount["left"] and amount["right"] <= PHONE["width"], where
        assert amount["cut"] == [], where
    return len(found)


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_every_list_on_a_phone_keeps_its_labels_and_shows_amounts_whole(  # noqa: F811
        lists, served_core, browser, language):
    page = _context(browser, viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=3,
                    extra_http_headers={"Accept-Language": language}).new_page()
    _log_in(page, served_core, "approver")
    pending, decided = lists["pending"], lists["decided"]
    checks = [
        ("/inbox/", "#inbox-rows td", AMOUNT, 2),
        ("/inbox/decided/", "#decided-list td", AMOUNT, 1),
        ("/runs/", "#run-list td", "80.00", 3),
        (f"/runs/{pending[0].run_id}/", "#tool-calls td, #timeline td", '"amount": 80', 1),
        ("/inbox/bulk/?" + "&".join(f"item={item.pk}" for item in pending), "#bulk-items td", AMOUNT, 4),
    ]
    for path, selector, amount, at_least in checks:
        page.goto(served_core + path)
        _assert_fits(page, path)
        _assert_cards(page, selector, path)
        assert _assert_amounts_whole(page, amount, path) >= at_least, path

    # The result page of that confirmation, with the outcome of each item.
    page.fill("#id_comment", "Checked: acme was paid already.")
    page.click("#bulk-reject")
    page.wait_for_selector("#bulk-outcome-table")
    _assert_fits(page, "bulk result")
    assert _assert_cards(page, "#bulk-outcome-table td", "bulk result") >= 2 * 4  # the empty "why" is not shown
    assert _assert_amounts_whole(page, AMOUNT, "bulk result") == 2
