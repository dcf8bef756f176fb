"""A person rejects a transfer: it never runs and the model hears why."""

import json

from tests.support.api import events, get_run, pending_interrupts, start_run, tool_calls, tool_messages
from tests.support.core import core_agent, lookup, transfer
from tests.support.fake_tools import transfers


def test_rejected_transfer_is_never_executed_and_the_model_is_told_why(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "transfer-rejected", [
        {"tool_calls": [lookup("acme")]},
        {"tool_calls": [transfer("acme", 80)]},
        {"content": "I'm sorry, the transfer was declined."},
    ])
    run = start_run(requester, agent["slug"])
    worker.drain()
    interrupt, = pending_interrupts(approver, run["id"])

    response = approver.post(f"/api/interrupts/{interrupt['id']}/reject/",
                             {"comment": "Acme is not a known payee."}, format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["decision"], response.json()["comment"]) == (
        "rejected", "Acme is not a known payee.")
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "not_achieved")
    call, = [c for c in tool_calls(requester, run["id"]) if c["name"] == "fake_transfer"]
    assert call["status"] == "rejected"
    assert (call["attempts"], call["idempotency_key"], call["result"]) == (0, "", None)
    assert len(transfers()) == 0
    told = json.loads(tool_messages(run["id"])[-1])
    assert told["status"] == "rejected"
    assert "Acme is not a known payee." in told["error"]
    resumed = [e for e in events(requester, run["id"]) if e["from_status"] == "waiting"]
    assert [e["actor"] for e in resumed] == ["user:approver"]
