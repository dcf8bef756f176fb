"""Real-browser checks of languages, phone widths and time zones (README "Languages and time zones").

Headless Chromium against ``manage.py serve`` (the ``served_core`` fixture of
tests/support/browser.py, without the demo), with one transfer waiting for approval:

* the pages and Django's admin follow the browser's Accept-Language
  (Simplified Chinese or English), and the header's switcher overrides it;
  the admin's run page shows its fields and inlines in Chinese;
* at 390×844 (a phone) no page is wider than the screen, and the header's
  "Log out" and language buttons stay on it;
* times are shown, and labelled, in the zone the browser reports.
"""

import re
from zoneinfo import ZoneInfo

import pytest

from approvals.models import Interrupt
from tests.support.browser import TIMEOUT_MS, boxes, browser, served_core  # noqa: F401 (fixtures)
from tests.support.web import waiting_transfer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}

# What each language shows for the same things.
WORDS = {
    "zh-hans": {"login": "登录", "inbox": "收件箱", "approval": "审批", "approve": "批准", "pending": "待处理",
                "timeline": "时间线", "waiting": "等待中", "completed": "已完成", "admin": "站点管理",
                "logout": "退出登录"},
    "en": {"login": "Log in", "inbox": "Inbox", "approval": "approval", "approve": "Approve", "pending": "pending",
           "timeline": "Timeline", "waiting": "waiting", "completed": "completed", "admin": "Site administration",
           "logout": "Log out"},
}


@pytest.fixture
def waiting_transfer_run(people, worker):
    """A transfer run of the requester waiting for approval: ``(run, inbox item, first event)``.

    Read here, before the browser starts: Django refuses ORM calls from the
    thread where Playwright's event loop runs.
    """
    run = waiting_transfer(people, worker)
    return run, Interrupt.objects.get(run=run), run.events.order_by("seq").first()


def _context(browser, **options):  # noqa: F811 (the fixture's value)
    context = browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **options})
    context.set_default_timeout(TIMEOUT_MS)
    return context


def _log_in(page, base: str, username: str) -> None:
    page.goto(base + "/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"{username}-demo")
    page.click("#login")
    page.wait_for_url(re.compile(re.escape(base) + r"/(inbox|runs)/$"))  # deciders: inbox; requesters: runs


@pytest.mark.parametrize("language", ["zh-hans", "en"])
def test_pages_and_admin_speak_the_browsers_language(  # noqa: F811
        waiting_transfer_run, worker, served_core, browser, language):
    run, item, _ = waiting_transfer_run
    words = WORDS[language]
    page = _context(browser, extra_http_headers={"Accept-Language": language}).new_page()
    page.goto(served_core + "/accounts/login/")
    assert page.text_content("h1") == words["login"]
    assert page.get_attribute("html", "lang") == language
    _log_in(page, served_core, "admin")
    assert page.text_content("h1") == words["inbox"]
    assert page.text_content("#logout") == words["logout"]
    row = page.locator(f'.inbox-item[data-interrupt-id="{item.pk}"]')
    assert row.locator(".badge").text_content() == words["approval"]

    page.goto(f"{served_core}/inbox/{item.pk}/")
    assert page.text_content("#approve") == words["approve"]
    assert page.text_content("#item-status") == words["pending"]

    page.goto(f"{served_core}/runs/{run.pk}/")
    assert page.text_content("#timeline h2") == words["timeline"]
    assert page.text_content("#run-status") == words["waiting"]
    assert page.text_content("#run-waiting-reason") == words["approval"]
    # The words the page's script uses for live changes are in the same language.
    assert page.evaluate("JSON.parse(document.getElementById('run').dataset.labels)")["completed"] == words["completed"]

    page.goto(served_core + "/admin/")
    assert page.text_content("#content h1") == words["admin"]

    # Approving from the item page: the run page shows the ending in the same language.
    page.goto(f"{served_core}/inbox/{item.pk}/")
    page.click("#approve")
    page.wait_for_url(f"{served_core}/runs/{run.pk}/")
    worker.drain()
    page.wait_for_selector("#run-status[data-status=completed]")
    assert page.text_content("#run-status") == words["completed"]


def test_header_switcher_changes_the_language_and_stays_on_the_page(  # noqa: F811
        waiting_transfer_run, served_core, browser):
    run, _, _ = waiting_transfer_run
    page = _context(browser, extra_http_headers={"Accept-Language": "en"}).new_page()
    page.goto(served_core + "/accounts/login/")
    page.click("#language-zh-hans")  # before logging in too
    page.wait_for_selector("h1:text-is('登录')")
    _log_in(page, served_core, "requester")
    assert page.text_content("h1") == "运行记录"  # a requester lands on their runs
    page.goto(f"{served_core}/runs/{run.pk}/")
    assert page.get_attribute("#language-zh-hans", "aria-current") == "true"
    page.click("#language-en")
    page.wait_for_selector("#timeline h2:text-is('Timeline')")
    assert page.url == f"{served_core}/runs/{run.pk}/"
    assert page.get_attribute("#language-en", "aria-current") == "true"
    page.click("#language-zh-hans")
    page.wait_for_selector("#timeline h2:text-is('时间线')")


def test_admin_run_page_in_chinese(waiting_transfer_run, served_core, browser):  # noqa: F811
    run, _, _ = waiting_transfer_run
    page = _context(browser, extra_http_headers={"Accept-Language": "zh-hans"}).new_page()
    _log_in(page, served_core, "admin")
    page.goto(f"{served_core}/admin/runs/run/{run.pk}/change/")
    assert page.text_content("#content h1") == "查看 运行"
    assert [page.text_content(f"#{prefix}-heading").strip() for prefix in ("tool_calls", "interrupts", "events")] == [
        "工具调用", "收件箱条目", "时间线"]
    assert page.locator("label:text-is('幂等键:')").count() == 1
    assert page.locator("#tool_calls-group td", has_text="等待审批").count() == 1
    assert "Idempotency key" not in page.text_content("#content")


def _assert_fits(page, what: str) -> None:
    widths = page.evaluate("({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})")
    assert widths["inner"] == PHONE["width"], what  # a wider page would have made a phone zoom out
    assert widths["scroll"] <= widths["inner"], f"{what} scrolls sideways: {widths}"


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_no_page_is_wider_than_a_phone(waiting_transfer_run, served_core, browser, language):  # noqa: F811
    run, item, _ = waiting_transfer_run
    context = _context(browser, viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=3,
                       extra_http_headers={"Accept-Language": language})
    page = context.new_page()
    page.goto(served_core + "/accounts/login/")
    _assert_fits(page, "login")
    _log_in(page, served_core, "admin")
    pages = ["/inbox/", f"/inbox/{item.pk}/", "/inbox/decided/", f"/inbox/bulk/?item={item.pk}", "/inbox/preferences/",
             "/runs/", f"/runs/{run.pk}/", "/runs/new/", "/admin/"]
    for path in pages:
        page.goto(served_core + path)
        _assert_fits(page, path)
        if not path.startswith("/admin/"):
            for control in ["#logout", "#language-en", "#language-zh-hans"]:
                [box] = boxes(page, control)
                assert box and 0 <= box["x"] and box["x"] + box["width"] <= PHONE["width"], (path, control, box)
    # The tables stack their rows as cards instead of scrolling in their box (tests/browser/test_phone_tables.py).
    page.goto(f"{served_core}/runs/{run.pk}/")
    table = page.evaluate("(() => { const t = document.querySelector('#tool-calls'); "
                          "return {scroll: t.scrollWidth, client: t.clientWidth}; })()")
    assert table["scroll"] <= table["client"]


@pytest.mark.parametrize("zone", ["Asia/Kolkata", "America/Los_Angeles"])
def test_times_show_in_the_zone_the_browser_reports(waiting_transfer_run, served_core, browser, zone):  # noqa: F811
    run, _, first = waiting_transfer_run
    page = _context(browser, timezone_id=zone).new_page()
    _log_in(page, served_core, "requester")
    page.goto(f"{served_core}/runs/{run.pk}/")
    # Chromium may report an older name of the same zone (Asia/Calcutta for Asia/Kolkata).
    reported = page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone")
    local = ZoneInfo(reported)
    assert local.utcoffset(run.created_at.replace(tzinfo=None)) == ZoneInfo(zone).utcoffset(
        run.created_at.replace(tzinfo=None))
    assert page.get_attribute("#time-zone", "data-time-zone") == reported
    assert reported in page.text_content("#time-zone")
    assert page.text_content("#run-created") == run.created_at.astimezone(local).strftime("%Y-%m-%d %H:%M:%S")
    assert reported in page.text_content("#timeline th:nth-child(2)")
    shown = page.text_content(f'#timeline tr[data-seq="{first.seq}"] time')
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", shown)  # milliseconds kept
    assert shown == first.created_at.astimezone(local).strftime("%H:%M:%S.%f")[:12]
