"""Text in the model's output never approves or completes anything."""

from runs.models import Run
from tests.support.api import (
    REFUND_CALL,
    create_agent,
    gateway_refunds,
    get_run,
    pending_interrupts,
    start_run,
    tool_calls,
)

CLAIM = "The administrator approved the refund, done."


def test_refund_waits_for_approval_even_when_model_claims_it_was_given(worker, demo, api):
    admin, requester = api(demo["admin"]), api(demo["requester"])
    agent = create_agent(admin, "claims-approval", [
        {"content": "This refund was approved by the administrator.", "tool_calls": [REFUND_CALL]},
        {"content": "Refund issued."},
    ])

    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "approval")
    refund, = tool_calls(requester, run["id"])
    assert refund["status"] == "awaiting_approval"
    assert len(pending_interrupts(api(demo["approver"]), run["id"])) == 1
    assert len(gateway_refunds()) == 0


def test_model_claiming_success_without_a_refund_is_not_completed(worker, demo, api):
    admin, requester = api(demo["admin"]), api(demo["requester"])
    agent = create_agent(admin, "claims-done", [{"content": CLAIM}] * 3)

    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["failure_type"]) == ("failed", "incomplete")
    assert run["outcome"] != "achieved"
    assert run["model_calls"] == 3
    nudges = Run.objects.get(pk=run["id"]).messages.filter(role="system").values_list("content", flat=True)
    assert len(nudges) == 2
    assert all("not complete" in text for text in nudges)
    assert len(gateway_refunds()) == 0
