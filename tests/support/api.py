"""Helpers shared by the REST API tests: define scripted agents, start runs, read them back, send at once."""

import threading

from django.db import connection

from runs.models import Run
from tools.demo import gateway
from tools.demo.data import CONTRACT_TEXT

REFUND_CALL = {"name": "refund", "arguments": "{\"order_id\": 123, \"amount\": 80}"}
QUERY_CALL = {"name": "query_order", "arguments": {"order_id": 123}}
# The contract email's scripted turns, ending with the claim that it was sent, whatever happened.
SENT_CLAIM = "The contract email has been sent."
SENT_CLAIM_TURNS = [
    {"tool_calls": [{"name": "legal_check", "arguments": {"text": CONTRACT_TEXT}}]},
    {"tool_calls": [{"name": "send_email", "arguments": {
        "to": "customer@example.com", "subject": "Your contract", "body": CONTRACT_TEXT}}]},
    {"content": SENT_CLAIM},
]


def create_agent(admin_api, slug: str, turns: list[dict], **extra) -> dict:
    """POST a scripted agent as staff; ``extra`` overrides tools, completion_check, ..."""
    body = {"slug": slug, "name": slug.replace("-", " ").title(), "instructions": "Test agent.",
            "model": {"provider": "scripted", "turns": turns},
            "tools": ["query_order", "refund"], "completion_check": "refund", **extra}
    response = admin_api.post("/api/agents/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def email_run_waiting(demo, api, worker, slug: str) -> dict:
    """A run of the requester's whose model ends saying the email was sent (``SENT_CLAIM_TURNS``), drained to
    where it waits for send_email's approval; returns the run's JSON."""
    agent = create_agent(api(demo["admin"]), slug, SENT_CLAIM_TURNS, tools=["legal_check", "send_email"],
                         completion_check="send_email")
    run = start_run(api(demo["requester"]), agent["slug"], "Send the customer their contract.")
    worker.drain()
    run = get_run(api(demo["requester"]), run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "approval")
    return run


def error_of(response, status: int) -> dict:
    """The error object of an error answer (asserting ``status`` and the shape every error has):
    ``{"code": str, "message": str, "details": dict}``."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["code"], str) and isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["details"], dict), error
    return error


def field_errors(response) -> dict:
    """``{field: [messages]}`` of a 400 about fields (asserting the error shape)."""
    error = error_of(response, 400)
    assert error["code"] == "invalid", error
    return error["details"]["fields"]


def start_run(client, agent: str, text: str = "Please refund order 123.", **headers) -> dict:
    """POST a run and return its JSON (asserting 201)."""
    response = client.post("/api/runs/", {"agent": agent, "input": text}, format="json", headers=headers)
    assert response.status_code == 201, response.json()
    return response.json()


def get_run(client, run_id: int) -> dict:
    response = client.get(f"/api/runs/{run_id}/")
    assert response.status_code == 200, response.json()
    return response.json()


def tool_calls(client, run_id: int) -> list[dict]:
    response = client.get(f"/api/runs/{run_id}/tool-calls/")
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def events(client, run_id: int) -> list[dict]:
    response = client.get(f"/api/runs/{run_id}/events/")
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def pending_interrupts(client, run_id: int) -> list[dict]:
    response = client.get("/api/interrupts/", {"status": "pending", "run": run_id})
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def tool_messages(run_id: int) -> list[str]:
    """Contents of the tool-result messages the model received in this run."""
    messages = Run.objects.get(pk=run_id).messages.filter(role="tool").order_by("id")
    return list(messages.values_list("content", flat=True))


def gateway_refunds() -> list[dict]:
    """Every refund the payment gateway made: ``[{"refund_id", "idempotency_key", "order_id", "amount"}]``."""
    return gateway.ledger()["refunds"]


def all_at_once(count: int, send) -> list:
    """``send(n)`` for n in 0..count-1, each from its own thread, all released together; the answers in order.

    Each thread closes its database connection when done.
    """
    start = threading.Barrier(count)
    answers = [None] * count

    def go(n):
        try:
            start.wait(timeout=10)
            answers[n] = send(n)
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers
