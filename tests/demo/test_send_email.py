"""The contract email: only after a passed legal check, only with approval, never just claimed."""

from django.core import mail

from runs.models import Run
from tests.support.api import create_agent, get_run, pending_interrupts, start_run, tool_calls
from tools.demo.data import CONTRACT_TEXT

LEGAL_CHECK = {"name": "legal_check", "arguments": {"text": CONTRACT_TEXT}}
SEND_EMAIL = {"name": "send_email",
              "arguments": {"to": "customer@example.com", "subject": "Your contract", "body": CONTRACT_TEXT}}
EMAIL_AGENT = {"tools": ["legal_check", "send_email"], "completion_check": "send_email"}


def test_demo_contract_email_is_sent_after_legal_check_and_approval(worker, demo, api):
    requester, approver = api(demo["requester"]), api(demo["approver"])
    run = start_run(requester, "send-contract-email", "Send the customer their contract.")
    worker.drain()
    assert get_run(requester, run["id"])["waiting_reason"] == "approval"
    assert [m for m in mail.outbox if m.to == ["customer@example.com"]] == []  # the approvers' notices aside

    interrupt, = pending_interrupts(approver, run["id"])
    assert interrupt["tool_call"]["name"] == "send_email"
    approver.post(f"/api/interrupts/{interrupt['id']}/approve/", {}, format="json")
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    sent, = [m for m in mail.outbox if m.to == ["customer@example.com"]]  # once, besides the approvers' notices
    send_call, = [c for c in tool_calls(requester, run["id"]) if c["name"] == "send_email"]
    assert sent.extra_headers["X-Idempotency-Key"] == send_call["idempotency_key"]


def test_email_claimed_as_sent_without_send_email_never_completes(worker, demo, api):
    agent = create_agent(api(demo["admin"]), "claims-sent",
                         [{"tool_calls": [LEGAL_CHECK]}] + [{"content": "I have sent the email."}] * 3, **EMAIL_AGENT)
    requester = api(demo["requester"])
    run = start_run(requester, agent["slug"], "Send the customer their contract.")
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["failure_type"]) == ("failed", "incomplete")
    assert run["outcome"] != "achieved"
    told = Run.objects.get(pk=run["id"]).messages.filter(role="system").values_list("content", flat=True)
    assert told and all("not complete" in text for text in told)
    assert [m for m in mail.outbox if m.to == ["customer@example.com"]] == []  # the approvers' notices aside


def test_send_email_before_legal_check_is_denied_and_sends_nothing(worker, demo, api):
    agent = create_agent(api(demo["admin"]), "email-first",
                         [{"tool_calls": [SEND_EMAIL]}, {"tool_calls": [LEGAL_CHECK]}, {"tool_calls": [SEND_EMAIL]}],
                         **EMAIL_AGENT)
    requester = api(demo["requester"])
    run = start_run(requester, agent["slug"], "Send the customer their contract.")
    worker.drain()

    first_send, legal, second_send = tool_calls(requester, run["id"])
    assert first_send["status"] == "denied"
    assert "legal_check" in first_send["error"]
    assert first_send["attempts"] == 0
    assert legal["status"] == "succeeded"
    assert second_send["status"] == "awaiting_approval"
    assert get_run(requester, run["id"])["waiting_reason"] == "approval"
    assert [m for m in mail.outbox if m.to == ["customer@example.com"]] == []  # the approvers' notices aside


def test_legal_check_of_one_text_does_not_clear_sending_another(worker, demo, api):
    other_body = {**SEND_EMAIL["arguments"], "body": "We guarantee unlimited refunds forever."}
    agent = create_agent(api(demo["admin"]), "email-switch",
                         [{"tool_calls": [LEGAL_CHECK]}, {"tool_calls": [{"name": "send_email", "arguments": other_body}]},
                          {"content": "Done."}], **EMAIL_AGENT)
    requester = api(demo["requester"])
    run = start_run(requester, agent["slug"], "Send the contract.")
    worker.drain()

    legal, send = tool_calls(requester, run["id"])
    assert (legal["status"], send["status"]) == ("succeeded", "denied")
    assert [m for m in mail.outbox if m.to == ["customer@example.com"]] == []  # the approvers' notices aside

