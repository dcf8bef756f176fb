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
from tests.support.inbox import pending_call

pytestmark = pytest.mark.django_db(transaction=True)

REFUND_60 = [{"content": "Order 123 arrived broken; refunding 60.00.",
              "tool_calls": [{"name": "refund", "arguments": {"order_id": 123, "amount": 60}}]},
             {"content": "Refunded."}]


# --- recorded and served ------------------------------------------------------------


@pytest.fixture
def refund_60(demo, worker, api):
    """A run waiting for approval of a 60.00 refund on order 123: ``(run id, item id)``."""
    agent = create_agent(api(demo["admin"]), "refund-sixty", REFUND_60)
    run = api_start_run(api(demo["requester"]), agent["slug"])
    worker.drain()
    return run["id"], Interrupt.objects.get(run_id=run["id"]).pk


AMOUNT_60_TO_40 = [{"path": "/amount", "field": "amount", "change": "changed", "proposed": 60, "approved": 40}]


def test_api_keeps_proposed_and_approved_arguments_apart_with_the_diff_and_comment(refund_60, demo, worker, api):
    run_id, item_id = refund_60
    approver = api(demo["approver"])
    response = approver.post(f"/api/interrupts/{item_id}/approve/",
                             {"arguments": {"order_id": 123, "amount": 40}, "comment": "Only the broken part."},
                             format="json")
    assert response.status_code == 200, response.json()
    item = response.json()
    assert item["proposed_arguments"] == {"order_id": 123, "amount": 60}
    assert item["edited_arguments"] == {"order_id": 123, "amount": 40}
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


def test_approved_as_proposed_has_no_changes(refund_60, demo, api):
    _run_id, item_id = refund_60
    item = api(demo["approver"]).post(f"/api/interrupts/{item_id}/approve/", {}, format="json").json()
    assert (item["edited_arguments"], item["changes"]) == (None, [])
    assert item["proposed_arguments"] == {"order_id": 123, "amount": 60}


def test_run_page_and_item_page_show_proposed_to_approved_and_the_comment(refund_60, demo, worker, client):
    run_id, item_id = refund_60
    client.force_login(demo["approver"])
    response = client.post(reverse("inbox-item", args=[item_id]), {
        "decision": "approved", "comment": "Only the broken part.",
        "edited_arguments": '{"order_id": 123, "amount": 40}'})
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


def test_item_page_says_why_with_summary_and_the_models_reason(refund_60, demo, client):
    _run_id, item_id = refund_60
    client.force_login(demo["approver"])
    page = client.get(reverse("inbox-item", args=[item_id])).content.decode()
    assert "Refund 60.00 on order 123" in page  # the tool's summary
    assert "sum(amount) per target within 30d &gt; 50" in page  # the rule that fired
    assert page.count("refunding 60.00") == 1  # the model's reason, shown once (not again in the conversation)


LETTER = "Dear customer,\n\n" + "\n".join(f"Clause {i}: the service runs as agreed in section {i}." for i in range(90)) \
    + "\n\nKind regards,\nThe contracts team"


def _section(page: str, section_id: str) -> str:
    start = page.index(f'id="{section_id}"')
    end = page.find("</section>", start)
    return page[start:end]


def test_an_email_reads_as_a_letter_and_each_value_is_shown_once_outside_the_edit_box(demo, worker, api, client):
    agent = create_agent(api(demo["admin"]), "letter", [
        {"tool_calls": [{"name": "legal_check", "arguments": {"text": LETTER}}]},
        {"tool_calls": [{"name": "send_email", "arguments": {"to": "customer@example.com", "subject": "Your contract",
                                                             "body": LETTER}}]},
        {"content": "Sent."}], tools=["legal_check", "send_email"], completion_check="default")
    run = api_start_run(api(demo["requester"]), agent["slug"])
    worker.drain()
    item = Interrupt.objects.get(run_id=run["id"], status=InterruptStatus.PENDING)
    assert item.tool_call.name == "send_email" and len(LETTER) > 4000
    client.force_login(demo["approver"])
    page = client.get(reverse("inbox-item", args=[item.pk])).content.decode()
    tool = _section(page, "tool")
    for name, value in [("to", "customer@example.com"), ("subject", "Your contract")]:
        assert re.search(rf'data-name="{name}"><div class="msg-body text-value">{re.escape(value)}</div>', tool)
    body = tool[tool.index('data-name="body"'):]
    assert "Clause 89: the service runs as agreed in section 89.\n\nKind regards,\nThe contracts team" in body
    assert "\\n" not in tool  # real line breaks, not a JSON string's escapes
    # The letter's last line: once in the call, once in the (collapsed) edit box, once as the legal check's
    # text among the earlier calls (a value of another call); never again in the conversation.
    last_line = "The contracts team"
    assert tool.count(last_line) == 1
    assert _section(page, "decision").count(last_line) == 1
    assert _section(page, "prior-tool-results").count(last_line) == 1
    assert _section(page, "conversation").count(last_line) == 0
    assert page.count(last_line) == 3


def test_409_page_says_who_decided_when_and_their_comment(refund_60, demo, client):
    _run_id, item_id = refund_60
    decide_interrupt(interrupt=Interrupt.objects.get(pk=item_id), user=demo["approver"], decision="rejected",
                     comment="Not without a photo.")
    client.force_login(demo["admin"])
    response = client.post(reverse("inbox-item", args=[item_id]), {"decision": "approved"})
    assert response.status_code == 409
    page = response.content.decode()
    assert "already resolved" in page
    assert "decided by <strong class=\"decided-by\">approver</strong>" in page and "Rejected" in page
    assert "Not without a photo." in page
    resolved_at = Interrupt.objects.get(pk=item_id).resolved_at
    assert resolved_at.strftime("%Y-%m-%d %H:%M:%S") in page  # UTC: the test client sends no time zone


def test_state_fragment_follows_the_item_and_is_hidden_from_others(refund_60, demo, client, django_user_model):
    _run_id, item_id = refund_60
    url = reverse("inbox-item-state", args=[item_id])
    client.force_login(demo["approver"])
    assert 'data-status="pending"' in client.get(url).content.decode()
    decide_interrupt(interrupt=Interrupt.objects.get(pk=item_id), user=demo["approver"], decision="approved",
                     comment="fine", edited_arguments={"order_id": 123, "amount": 40})
    fragment = client.get(url).content.decode()
    assert 'data-status="resolved"' in fragment and "fine" in fragment and '<ins class="approved">40</ins>' in fragment
    client.force_login(django_user_model.objects.create_user("stranger"))
    assert client.get(url).status_code == 404


def test_an_item_that_never_expires_says_so_on_the_run_page(demo, client):
    item = pending_call(requester=demo["requester"], expires_in=None)
    client.force_login(demo["approver"])
    page = client.get(reverse("run-detail", args=[item.run_id])).content.decode()
    pending = page[page.index('id="pending-items"'):page.index('id="tool-calls"')]
    assert "does not expire" in pending and "expires in" not in pending


def test_item_page_names_who_allowed_an_agent_rule_that_replaces_the_tools(demo, worker, client):
    agent = Agent.objects.create(
        slug="loose-refunds", name="Loose", tools=["refund"], completion_check="default",
        approval_policy={"refund": "amount > 55"}, approval_policy_granted_by=demo["admin"],
        model={"provider": "scripted", "turns": REFUND_60})
    run = start_run(agent=agent, user=demo["requester"], input="refund it")
    worker.drain()
    item = Interrupt.objects.get(run=run)
    client.force_login(demo["approver"])
    page = client.get(reverse("inbox-item", args=[item.pk])).content.decode()
    rule = page[page.index('id="why-rule"'):page.index("</dd>", page.index('id="why-rule"'))]
    assert "amount &gt; 55" in rule
    policy = page[page.index('id="why-policy"'):page.index("</dd>", page.index('id="why-policy"'))]
    assert "sum(amount) per target within 30d &gt; 50" in policy and "amount &gt; 55" in policy
    assert 'loosening allowed by <strong class="granted-by">admin</strong>' in policy
