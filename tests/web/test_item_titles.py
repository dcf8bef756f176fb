"""Inbox items read as what their call does ("Pay 80.00 to acme"), in the reader's language (issue 27).

Every surface that names an item (history, run page, bulk confirmation and
result, item page, emails, the Django admin) builds its title when it
renders, from the call's tool and arguments (``Interrupt.display_title``),
in the request's or the recipient's language; the stored title stays the
English one the API answers with. Rows written before (a stored "Approve
refund?") render the same way; items with nothing to build from show what
was stored. Real parts: a tool of this test's own whose title follows the
active language (``pay``), the ``people`` users, the services that open and
decide items, Django's test client and locmem mail backend.
"""

import pytest
from bs4 import BeautifulSoup
from django.core import mail
from django.test import Client
from django.utils import translation
from django.utils.translation import get_language

from approvals.bulk import fingerprint
from approvals.models import Interrupt, InterruptKind, NotificationPreference
from approvals.notifications import send_new_item
from approvals.services import decide_interrupt, request_reconciliation
from tests.support.inbox import pending_call
from tools import registry
from tools.models import ToolCall
from tools.registry import Tool

pytestmark = pytest.mark.django_db(transaction=True)

TITLES = {"en": "Pay 80.00 to acme", "zh-hans": "向 acme 付款 80.00"}
LANGUAGES = list(TITLES)


def pay_title(arguments: dict) -> str:
    """``pay``'s title in the active language (English unless it is Chinese)."""
    payee, amount = arguments["payee"], float(arguments["amount"])
    return f"向 {payee} 付款 {amount:.2f}" if get_language() == "zh-hans" else f"Pay {amount:.2f} to {payee}"


@pytest.fixture
def pay_tool():
    """The tool ``pay`` (changes things, always approved), its title ``pay_title``; registered for the test only."""
    tool = registry.register(Tool(
        name="pay", description="Pay an amount to a payee (a test tool).", handler=lambda ctx, a: {"paid": True},
        side_effect=True, approval="always", target_key="payee", title=pay_title,
        parameters={"type": "object", "properties": {"payee": {"type": "string"}, "amount": {"type": "number"}},
                    "required": ["payee", "amount"]}))
    yield tool
    registry._TOOLS.pop(tool.name)


@pytest.fixture
def items(people, pay_tool):
    """A pending payment of 80 to acme and a rejected one of 80 to acme (another run)."""
    pending = pending_call(requester=people["requester"], name="pay", arguments={"payee": "acme", "amount": 80},
                           rule="always")
    decided = pending_call(requester=people["requester"], name="pay", arguments={"payee": "acme", "amount": 80},
                           rule="always")
    decide_interrupt(interrupt=decided, user=people["approver"], decision="rejected", comment="Twice the same payment.")
    return {"pending": pending, "decided": Interrupt.objects.get(pk=decided.pk)}


def reader(user, language: str) -> Client:
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.force_login(user)
    return client


def page(client, url: str, **kwargs) -> BeautifulSoup:
    response = client.post(url, kwargs["data"]) if "data" in kwargs else client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return BeautifulSoup(response.content, "html.parser")


def text(node) -> str:
    return " ".join(node.get_text(" ").split())


def test_a_new_item_stores_its_english_title_and_the_api_answers_with_it(items, people, api):
    assert items["pending"].title == "Pay 80.00 to acme"
    body = api(people["approver"]).get(f"/api/interrupts/{items['pending'].pk}/", HTTP_ACCEPT_LANGUAGE="zh-hans").json()
    assert body["title"] == "Pay 80.00 to acme"


@pytest.mark.parametrize("language", LANGUAGES)
def test_history_run_page_and_item_page_show_the_informative_title(items, people, language):
    title, client = TITLES[language], reader(people["approver"], language)
    pending, decided = items["pending"], items["decided"]

    history = page(client, "/inbox/decided/")
    row = history.select_one(f'tr.decided-item[data-interrupt-id="{decided.pk}"]')
    assert row.select_one("a").get_text() == title

    run_page = page(client, f"/runs/{decided.run_id}/")
    assert [a.get_text() for a in run_page.select("#decisions .decided-item > a")] == [title]
    run_page = page(client, f"/runs/{pending.run_id}/")
    assert [a.get_text() for a in run_page.select("#pending-items a.pending-item")] == [title]

    item_page = page(client, f"/inbox/{pending.pk}/")
    assert item_page.select_one("#item-title").get_text() == title
    assert item_page.title.get_text().startswith(title)


@pytest.mark.parametrize("language", LANGUAGES)
def test_bulk_confirmation_and_result_pages_show_the_informative_title(items, people, language):
    title, client = TITLES[language], reader(people["approver"], language)
    pending = items["pending"]

    confirm = page(client, f"/inbox/bulk/?item={pending.pk}")
    assert confirm.select_one(f'tr.bulk-item[data-interrupt-id="{pending.pk}"] td a').get_text() == title

    result = page(client, "/inbox/bulk/", data={"item": pending.pk, f"fingerprint-{pending.pk}": fingerprint(pending),
                                                 "decision": "rejected", "comment": "Not this one."})
    outcome = result.select_one(f'tr.bulk-outcome[data-interrupt-id="{pending.pk}"] a')
    assert outcome.get_text() == title
    outcomes = page(client, f"/inbox/bulk/outcomes/?item={pending.pk}")  # what the result page re-fetches
    assert outcomes.select_one("tr.bulk-outcome a").get_text() == title


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_admin_shows_the_informative_title_in_list_item_run_and_bulk_confirmation(items, people, language):
    title, client = TITLES[language], reader(people["admin"], language)
    pending = items["pending"]

    changelist = page(client, "/admin/approvals/interrupt/")
    assert title in [text(cell) for cell in changelist.select("#result_list td.field-shown_title")]
    change = page(client, f"/admin/approvals/interrupt/{pending.pk}/change/")
    assert text(change.select_one(".field-shown_title .readonly")) == title
    assert "Approve refund?" not in change.get_text() and not change.select(".field-title")
    run_change = page(client, f"/admin/runs/run/{pending.run_id}/change/")
    assert [text(cell) for cell in run_change.select("td.field-title_")] == [title]
    confirm = page(client, "/admin/approvals/interrupt/",
                   data={"action": "reject_selected", "_selected_action": [pending.pk]})
    assert title in [text(cell) for cell in confirm.select("#admin-bulk-items td")]


@pytest.mark.parametrize("language", LANGUAGES)
def test_an_email_names_the_item_by_its_call_in_the_recipients_language(items, people, language):
    NotificationPreference.objects.create(user=people["approver"], language=language)
    mail.outbox.clear()

    send_new_item(items["pending"].pk)

    [message] = [m for m in mail.outbox if m.to == ["approver@example.com"]]
    assert message.subject.endswith(TITLES[language])
    assert message.body.splitlines()[2] == TITLES[language]  # after the greeting and a blank line


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_stored_title_of_an_older_row_is_built_from_its_call_when_shown(items, people, language):
    decided = items["decided"]
    Interrupt.objects.filter(pk=decided.pk).update(title="Approve refund?")  # as items were opened before

    history = page(reader(people["approver"], language), "/inbox/decided/")
    row = history.select_one(f'tr.decided-item[data-interrupt-id="{decided.pk}"]')
    assert row.select_one("a").get_text() == TITLES[language]


def test_questions_items_without_a_call_and_unknown_tools_keep_what_can_be_said(items, people):
    question = items["pending"]
    Interrupt.objects.filter(pk=question.pk).update(kind=InterruptKind.INPUT, title="Which card should we refund to?")
    orphan = items["decided"]
    Interrupt.objects.filter(pk=orphan.pk).update(tool_call=None, title="Approve refund?")

    client = reader(people["approver"], "zh-hans")
    assert page(client, f"/inbox/{question.pk}/").select_one("#item-title").get_text() == (
        "Which card should we refund to?")  # the model's words, as it asked them
    assert page(client, f"/inbox/{orphan.pk}/").select_one("#item-title").get_text() == "Approve refund?"

    call = ToolCall.objects.get(pk=question.tool_call_id)
    ToolCall.objects.filter(pk=call.pk).update(name="retired_tool")  # a tool no longer registered
    Interrupt.objects.filter(pk=question.pk).update(kind=InterruptKind.APPROVAL)
    assert page(client, f"/inbox/{question.pk}/").select_one("#item-title").get_text() == (
        "retired_tool(amount=80, payee=acme)")  # an unknown tool's keys by name, whatever the database keeps


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_reconciliation_item_says_whose_outcome_is_unknown(items, people, language):
    item = request_reconciliation(tool_call=items["pending"].tool_call)
    with translation.override("en"):
        assert item.title == "Outcome unknown: Pay 80.00 to acme"
    expected = {"en": "Outcome unknown: Pay 80.00 to acme", "zh-hans": "结果未知：向 acme 付款 80.00"}

    item_page = page(reader(people["approver"], language), f"/inbox/{item.pk}/")
    assert item_page.select_one("#item-title").get_text() == expected[language]
