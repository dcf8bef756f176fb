"""The inbox item page and auditable edits (issue 12): the diff shown, the API fields, the 409 page, the fragments.

The diff itself (``tools.services.edits.argument_changes``) is
tests/unit/test_argument_changes.py; the real-browser side (live update,
the whole approve-with-edit path, the reconciliation page) is
``tests/browser/test_item.py``.
"""

import re

import pytest
from django.urls import reverse

from approvals.models import Interrupt, InterruptStatus
from approvals.services import decide_interrupt
from runs.engine.lifecycle import start_run
from runs.models import Agent, RunStatus
from tests.support.api import create_agent, events, get_run
from tests.support.api import start_run as api_start_run
from tests.support.core import core_agent, pending_transfer, transfer

pytestmark = pytest.mark.django_db(transaction=True)

TRANSFER_60 = [{"content": "Acme sent back half of the parts; transferring 60.00.",
                "tool_calls": [transfer("acme", 60)]},
               {"content": "Transferred."}]


# --- recorded and served ------------------------------------------------------------


@pytest.fixture
def transfer_60(people, worker, api):
    """A run waiting for approval of a transfer of 60.00 to acme: ``(run id, item id)``."""
    agent = core_agent(api(people["admin"]), "send-sixty", TRANSFER_60)
    run = api_start_run(api(people["requester"]), agent["slug"], "Pay acme back for the returned parts.")
    worker.drain()
    return run["id"], Interrupt.objects.get(run_id=run["id"]).pk


AMOUNT_60_TO_40 = [{"path": "/amount", "field": "amount", "change": "changed", "proposed": 60, "approved": 40}]


def test_api_keeps_proposed_and_approved_arguments_apart_with_the_diff_and_comment(transfer_60, people, worker, api):
    run_id, item_id = transfer_60
    approver = api(people["approver"])
    response = approver.post(f"/api/interrupts/{item_id}/approve/",
                             {"arguments": {"account": "acme", "amount": 40}, "comment": "Only the broken part."},
                             format="json")
    assert response.status_code == 200, response.json()
    item = response.json()
    assert item["proposed_arguments"] == {"account": "acme", "amount": 60}
    assert item["edited_arguments"] == {"account": "acme", "amount": 40}
    assert item["changes"] == AMOUNT_60_TO_40
    worker.drain()

    run = get_run(approver, run_id)
    assert run["status"] == RunStatus.COMPLETED
    decision, = run["decisions"]
    assert decision["interrupt"] == item_id and decision["decision"] == "approved"
    assert (decision["decided_by"], decision["comment"], decision["changes"]) == (
        "approver", "Only the broken part.", AMOUNT_60_TO_40)
    resolved, = [e for e in events(approver, run_id) if e["type"] == "interrupt" and e["to_status"] == "resolved"]
    assert resolved["payload"]["changes"] == AMOUNT_60_TO_40
    assert resolved["payload"]["comment"] == "Only the broken part."
    listed, = [r for r in approver.get("/api/runs/").json()["results"] if r["id"] == run_id]
    assert listed["decisions"] == run["decisions"]


def test_approved_as_proposed_has_no_changes(transfer_60, people, api):
    _run_id, item_id = transfer_60
    item = api(people["approver"]).post(f"/api/interrupts/{item_id}/approve/", {}, format="json").json()
    assert (item["edited_arguments"], item["changes"]) == (None, [])
    assert item["proposed_arguments"] == {"account": "acme", "amount": 60}


def test_run_page_and_item_page_show_proposed_to_approved_and_the_comment(transfer_60, people, worker, client):
    run_id, item_id = transfer_60
    client.force_login(people["approver"])
    response = client.post(reverse("inbox-item", args=[item_id]), {
        "decision": "approved", "comment": "Only the broken part.",
        "edited_arguments": '{"account": "acme", "amount": 40}'})
    assert response.status_code == 302
    worker.drain()
    run_page = client.get(reverse("run-detail", args=[run_id])).content.decode()
    decisions = run_page[run_page.index('id="decisions"'):run_page.index('id="tool-calls"')]
    assert "decided by <strong class=\"decided-by\">approver</strong>" in decisions
    assert "Only the broken part." in decisions
    assert re.search(r'data-path="/amount">.*?<del class="proposed">60</del>\s*→\s*<ins class="approved">40</ins>',
                     decisions, re.S)
    timeline = run_page[run_page.index('id="timeline"'):]
    assert re.search(r'<del class="proposed">60</del>\s*→\s*<ins class="approved">40</ins>', timeline)
    item_page = client.get(reverse("inbox-item", args=[item_id])).content.decode()
    assert re.search(r'<del class="proposed">60</del>\s*→\s*<ins class="approved">40</ins>', item_page)
    # The arguments shown are the proposed ones; the approved value appears only in the change.
    assert re.search(r'data-name="amount"><code>60</code>', item_page)


def test_item_page_says_why_with_summary_and_the_models_reason(transfer_60, people, client):
    _run_id, item_id = transfer_60
    client.force_login(people["approver"])
    page = client.get(reverse("inbox-item", args=[item_id])).content.decode()
    assert "fake_transfer(account=acme, amount=60)" in page  # the call's summary
    assert "<code>amount &gt; 10</code>" in page  # the rule that fired
    assert page.count("transferring 60.00") == 1  # the model's reason, shown once (not again in the conversation)


LETTER = "Dear customer,\n\n" + "\n".join(f"Clause {i}: the service runs as agreed in section {i}." for i in range(90)) \
    + "\n\nKind regards,\nThe contracts team"
TEXT = {"type": "string", "minLength": 1, "maxLength": 20000}


@pytest.fixture
def letter_tools():
    """Two tools of this test's own taking long text: ``check_letter`` (read-only) and ``send_letter`` (changes
    things, always approved by a person); registered for the test only."""
    from tools import registry
    from tools.registry import Tool

    tools = [Tool(name="check_letter", description="Check a letter (a test tool).", handler=lambda ctx, a: {"ok": True},
                  parameters={"type": "object", "properties": {"text": TEXT}, "required": ["text"]}),
             Tool(name="send_letter", description="Send a letter (a test tool).", side_effect=True, approval="always",
                  handler=lambda ctx, a: {"sent_to": a["to"]},
                  parameters={"type": "object", "properties": {"to": TEXT, "subject": TEXT, "body": TEXT},
                              "required": ["to", "subject", "body"]})]
    for tool in tools:
        registry.register(tool)
    yield tools
    for tool in tools:
        registry._TOOLS.pop(tool.name)


def _section(page: str, section_id: str) -> str:
    start = page.index(f'id="{section_id}"')
    end = page.find("</section>", start)
    return page[start:end]


def test_an_email_reads_as_a_letter_and_each_value_is_shown_once_outside_the_edit_box(people, worker, api, client,
                                                                                       letter_tools):
    agent = create_agent(api(people["admin"]), "letter", [
        {"tool_calls": [{"name": "check_letter", "arguments": {"text": LETTER}}]},
        {"tool_calls": [{"name": "send_letter", "arguments": {"to": "customer@example.com", "subject": "Your contract",
                                                              "body": LETTER}}]},
        {"content": "Sent."}], tools=["check_letter", "send_letter"], completion_check="default")
    run = api_start_run(api(people["requester"]), agent["slug"], "Send the customer their contract.")
    worker.drain()
    item = Interrupt.objects.get(run_id=run["id"], status=InterruptStatus.PENDING)
    assert item.tool_call.name == "send_letter" and len(LETTER) > 4000
    client.force_login(people["approver"])
    page = client.get(reverse("inbox-item", args=[item.pk])).content.decode()
    tool = _section(page, "tool")
    for name, value in [("to", "customer@example.com"), ("subject", "Your contract")]:
        assert re.search(rf'data-name="{name}"><div class="msg-body text-value">{re.escape(value)}</div>', tool)
    body = tool[tool.index('data-name="body"'):]
    assert "Clause 89: the service runs as agreed in section 89.\n\nKind regards,\nThe contracts team" in body
    assert "\\n" not in tool  # real line breaks, not a JSON string's escapes
    # The letter's last line: once in the call, once in the (collapsed) edit box, once as the check's
    # text among the earlier calls (a value of another call); never again in the conversation.
    last_line = "The contracts team"
    assert tool.count(last_line) == 1
    assert _section(page, "decision").count(last_line) == 1
    assert _section(page, "prior-tool-results").count(last_line) == 1
    assert _section(page, "conversation").count(last_line) == 0
    assert page.count(last_line) == 3


def test_409_page_says_who_decided_when_and_their_comment(transfer_60, people, client):
    _run_id, item_id = transfer_60
    decide_interrupt(interrupt=Interrupt.objects.get(pk=item_id), user=people["approver"], decision="rejected",
                     comment="Not without a photo.")
    client.force_login(people["admin"])
    response = client.post(reverse("inbox-item", args=[item_id]), {"decision": "approved"})
    assert response.status_code == 409
    page = response.content.decode()
    assert "already resolved" in page
    assert "decided by <strong class=\"decided-by\">approver</strong>" in page and "Rejected" in page
    assert "Not without a photo." in page
    resolved_at = Interrupt.objects.get(pk=item_id).resolved_at
    assert resolved_at.strftime("%Y-%m-%d %H:%M:%S") in page  # UTC: the test client sends no time zone


def test_state_fragment_follows_the_item_and_is_hidden_from_others(transfer_60, people, client, django_user_model):
    _run_id, item_id = transfer_60
    url = reverse("inbox-item-state", args=[item_id])
    client.force_login(people["approver"])
    assert 'data-status="pending"' in client.get(url).content.decode()
    decide_interrupt(interrupt=Interrupt.objects.get(pk=item_id), user=people["approver"], decision="approved",
                     comment="fine", edited_arguments={"account": "acme", "amount": 40})
    fragment = client.get(url).content.decode()
    assert 'data-status="resolved"' in fragment and "fine" in fragment and '<ins class="approved">40</ins>' in fragment
    client.force_login(django_user_model.objects.create_user("stranger"))
    assert client.get(url).status_code == 404


def test_an_item_that_never_expires_says_so_on_the_run_page(people, client):
    item = pending_transfer(requester=people["requester"], expires_in=None)
    client.force_login(people["approver"])
    page = client.get(reverse("run-detail", args=[item.run_id])).content.decode()
    pending = page[page.index('id="pending-items"'):page.index('id="tool-calls"')]
    assert "does not expire" in pending and "expires in" not in pending


def test_item_page_names_who_allowed_an_agent_rule_that_replaces_the_tools(people, worker, client):
    agent = Agent.objects.create(
        slug="loose-transfers", name="Loose", tools=["fake_transfer"], completion_check="default",
        approval_policy={"fake_transfer": "amount > 55"}, approval_policy_granted_by=people["admin"],
        model={"provider": "scripted", "turns": TRANSFER_60})
    run = start_run(agent=agent, user=people["requester"], input="send it")
    worker.drain()
    item = Interrupt.objects.get(run=run)
    client.force_login(people["approver"])
    page = client.get(reverse("inbox-item", args=[item.pk])).content.decode()
    rule = page[page.index('id="why-rule"'):page.index("</dd>", page.index('id="why-rule"'))]
    assert "amount &gt; 55" in rule
    policy = page[page.index('id="why-policy"'):page.index("</dd>", page.index('id="why-policy"'))]
    assert "amount &gt; 10" in policy and "amount &gt; 55" in policy
    assert 'loosening allowed by <strong class="granted-by">admin</strong>' in policy
