"""A refund over the approval threshold, through the REST API end to end."""

from decimal import Decimal

import pytest

from runs.models import Run
from tests.demo.support import QUERY_CALL, REFUND_CALL, demo_agent, gateway_refunds
from tests.support.api import error_of, events, get_run, pending_interrupts, start_run, tool_calls
from tools.demo import gateway

REFUND_TURNS = [
    {"tool_calls": [QUERY_CALL]},
    {"tool_calls": [REFUND_CALL]},
    {"content": "Refund issued."},
]


@pytest.fixture
def refund_agent(demo, api):
    return demo_agent(api(demo["admin"]), "api-refund", REFUND_TURNS)["slug"]


def test_refund_waits_for_approval_then_executes_exactly_once(worker, demo, api, refund_agent):
    requester, approver = api(demo["requester"]), api(demo["approver"])

    run = start_run(requester, refund_agent)
    assert run["status"] == "queued"
    assert run["agent"] == refund_agent
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "approval")
    pending = pending_interrupts(approver, run["id"])
    assert len(pending) == 1
    assert pending[0]["tool_call"]["name"] == "refund"
    assert pending[0]["tool_call"]["arguments"] == {"order_id": 123, "amount": 80}
    assert pending[0]["can_decide"] is True
    assert len(gateway_refunds()) == 0

    response = approver.post(f"/api/interrupts/{pending[0]['id']}/approve/", {"comment": "ok"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "resolved"
    assert response.json()["decision"] == "approved"
    assert response.json()["resolved_by"] == "approver"
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    assert run["final_output"] == "Refund issued."
    refund_call, = [c for c in tool_calls(requester, run["id"]) if c["name"] == "refund"]
    assert refund_call["status"] == "succeeded"
    assert refund_call["attempts"] == 1
    refund, = gateway_refunds()
    assert refund["idempotency_key"] == refund_call["idempotency_key"] != ""
    assert (refund["order_id"], Decimal(refund["amount"])) == (123, 80)
    assert gateway.ledger()["requests_per_key"] == {refund["idempotency_key"]: 1}


def test_run_events_record_every_transition_in_order_with_its_actor(worker, demo, api, refund_agent):
    requester, approver = api(demo["requester"]), api(demo["approver"])
    run = start_run(requester, refund_agent)
    worker.drain()
    interrupt, = pending_interrupts(approver, run["id"])
    approver.post(f"/api/interrupts/{interrupt['id']}/approve/", {}, format="json")
    worker.drain()

    log = events(requester, run["id"])
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    transitions = [(e["from_status"], e["to_status"], e["actor"]) for e in log if e["type"] == "transition"]
    assert transitions == [
        ("", "queued", "user:requester"),
        ("queued", "running", "worker"),
        ("running", "waiting", "worker"),
        ("waiting", "running", "user:approver"),
        ("running", "completed", "worker"),
    ]
    waiting = next(e for e in log if e["to_status"] == "waiting")
    assert waiting["payload"]["waiting_reason"] == "approval"


def test_events_are_cursor_paginated_in_seq_order(worker, demo, api, refund_agent):
    requester = api(demo["requester"])
    run = start_run(requester, refund_agent)
    worker.drain()
    total = Run.objects.get(pk=run["id"]).events.count()
    assert total > 3

    seqs, pages, url = [], 0, f"/api/runs/{run['id']}/events/?page_size=3"
    while url:
        page = requester.get(url).json()
        assert len(page["results"]) <= 3
        seqs += [e["seq"] for e in page["results"]]
        pages, url = pages + 1, page["next"]
    assert seqs == list(range(1, total + 1))
    assert pages == -(-total // 3)


def test_same_idempotency_key_returns_the_same_run(worker, demo, api, refund_agent):
    requester = api(demo["requester"])

    first = start_run(requester, refund_agent, **{"Idempotency-Key": "order-123-refund"})
    second = start_run(requester, refund_agent, **{"Idempotency-Key": "order-123-refund"})

    assert second["id"] == first["id"]
    assert Run.objects.count() == 1
    worker.drain()
    assert Run.objects.get().model_calls == 2  # query_order, refund: the script ran once


def test_idempotency_key_reused_for_a_different_request_is_refused(demo, api, refund_agent):
    requester = api(demo["requester"])
    start_run(requester, refund_agent, **{"Idempotency-Key": "k1"})

    response = requester.post("/api/runs/", {"agent": refund_agent, "input": "Something else"}, format="json",
                              headers={"Idempotency-Key": "k1"})

    assert error_of(response, 422)["code"] == "idempotency_key_reused"
    assert Run.objects.count() == 1


def test_a_supplement_sent_twice_with_one_key_is_added_once(demo, api, refund_agent):
    from runs.models import Message

    requester = api(demo["requester"])
    first = start_run(requester, refund_agent)
    Run.objects.filter(pk=first["id"]).update(status="running")  # the session's run is busy
    body = {"agent": refund_agent, "input": "Also, it was a gift.", "session": first["session"],
            "multitask_strategy": "supplement"}

    answers = [requester.post("/api/runs/", body, format="json", headers={"Idempotency-Key": "ps-1"})
               for _ in range(2)]

    assert [a.status_code for a in answers] == [200, 200]
    assert {a.json()["id"] for a in answers} == {first["id"]}
    assert Message.objects.filter(run_id=first["id"], content="Also, it was a gift.").count() == 1
    other = requester.post("/api/runs/", {**body, "input": "Something else"}, format="json",
                           headers={"Idempotency-Key": "ps-1"})
    assert error_of(other, 422)["code"] == "idempotency_key_reused"
