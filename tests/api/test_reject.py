"""A person rejects a refund: it never runs and the model hears why."""

import json

from tests.support.api import (
    QUERY_CALL,
    REFUND_CALL,
    create_agent,
    events,
    gateway_refunds,
    get_run,
    pending_interrupts,
    start_run,
    tool_calls,
    tool_messages,
)


def test_rejected_refund_is_never_executed_and_the_model_is_told_why(worker, demo, api):
    admin, requester, approver = api(demo["admin"]), api(demo["requester"]), api(demo["approver"])
    agent = create_agent(admin, "refund-rejected", [
        {"tool_calls": [QUERY_CALL]},
        {"tool_calls": [REFUND_CALL]},
        {"content": "I'm sorry, the refund was declined."},
    ])
    run = start_run(requester, agent["slug"])
    worker.drain()
    interrupt, = pending_interrupts(approver, run["id"])

    response = approver.post(f"/api/interrupts/{interrupt['id']}/reject/",
                             {"comment": "Item was used; refund policy does not apply."}, format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["decision"], response.json()["comment"]) == (
        "rejected", "Item was used; refund policy does not apply.")
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "not_achieved")
    refund, = [c for c in tool_calls(requester, run["id"]) if c["name"] == "refund"]
    assert refund["status"] == "rejected"
    assert (refund["attempts"], refund["idempotency_key"], refund["result"]) == (0, "", None)
    assert len(gateway_refunds()) == 0
    told = json.loads(tool_messages(run["id"])[-1])
    assert told["status"] == "rejected"
    assert "Item was used; refund policy does not apply." in told["error"]
    resumed = [e for e in events(requester, run["id"]) if e["from_status"] == "waiting"]
    assert [e["actor"] for e in resumed] == ["user:approver"]
