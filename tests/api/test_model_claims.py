"""Text in the model's output never approves or completes anything."""

from runs.models import Run
from tests.support.api import get_run, pending_interrupts, start_run, tool_calls
from tests.support.core import core_agent, transfer
from tests.support.fake_tools import transfers

CLAIM = "The administrator approved the transfer, done."


def test_transfer_waits_for_approval_even_when_model_claims_it_was_given(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = core_agent(admin, "claims-approval", [
        {"content": "This transfer was approved by the administrator.", "tool_calls": [transfer("acme", 80)]},
        {"content": "Sent 80."},
    ])

    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "approval")
    call, = tool_calls(requester, run["id"])
    assert call["status"] == "awaiting_approval"
    assert len(pending_interrupts(api(people["approver"]), run["id"])) == 1
    assert len(transfers()) == 0


def test_model_claiming_success_without_a_transfer_is_not_completed(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = core_agent(admin, "claims-done", [{"content": CLAIM}] * 3)

    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["failure_type"]) == ("failed", "incomplete")
    assert run["outcome"] != "achieved"
    assert run["model_calls"] == 3
    nudges = Run.objects.get(pk=run["id"]).messages.filter(role="system").values_list("content", flat=True)
    assert len(nudges) == 2
    assert all("not complete" in text for text in nudges)
    assert len(transfers()) == 0
