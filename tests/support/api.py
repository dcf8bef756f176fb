"""Helpers shared by the REST API tests: define scripted agents, start runs, read them back, send at once."""

import threading

from django.db import connection

from runs.models import Run


def create_agent(admin_api, slug: str, turns: list[dict], **extra) -> dict:
    """POST a scripted agent as staff; ``extra``: its other fields (tools, completion_check, ...)."""
    body = {"slug": slug, "name": slug.replace("-", " ").title(), "instructions": "Test agent.",
            "model": {"provider": "scripted", "turns": turns}, **extra}
    response = admin_api.post("/api/agents/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


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
