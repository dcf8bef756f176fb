"""Issue 22: ``GET /api/runs/{id}/steps/``: a run's model calls, in cursor pages, for whoever may read the run.

A failed step's error over real HTTP (a server's 400 and its message) is in
test_provider_errors.py; here the content of answered steps, the pages and
who may read them.
"""

import json
from datetime import datetime

import pytest
from django.contrib.auth import get_user_model

from tests.support.api import get_run, start_run
from tests.support.core import core_agent, lookup

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished_run(worker, people, api):
    """A completed run of the requester's: a lookup (11 in, 3 out), then the answer (20 in, 7 out)."""
    agent = core_agent(api(people["admin"]), "steps-lookup", [
        {"tool_calls": [lookup("acme")], "usage": {"input_tokens": 11, "output_tokens": 3}},
        {"content": "Found acme.", "usage": {"input_tokens": 20, "output_tokens": 7}},
    ], tools=["fake_lookup"], completion_check="default")
    run = start_run(api(people["requester"]), agent["slug"], "Look acme up.")
    worker.drain()
    assert get_run(api(people["requester"]), run["id"])["status"] == "completed"
    return run["id"]


def test_steps_list_each_model_call_with_status_timings_usage_and_finish_reason(people, api, finished_run):
    response = api(people["requester"]).get(f"/api/runs/{finished_run}/steps/")

    assert response.status_code == 200
    body = response.json()
    assert (body["next"], body["previous"]) == (None, None)
    steps = body["results"]
    assert [(s["index"], s["status"], s["finish_reason"]) for s in steps] == [
        (0, "succeeded", "tool_calls"), (1, "succeeded", "stop")]
    assert [(s["input_tokens"], s["output_tokens"]) for s in steps] == [(11, 3), (20, 7)]
    assert all((s["error"], s["server_error"], s["cost_usd"]) == ("", None, "0.000000") for s in steps)
    times = [datetime.fromisoformat(t) for s in steps for t in (s["started_at"], s["finished_at"])]
    assert times == sorted(times), "each step ends before the next starts"
    run = get_run(api(people["requester"]), finished_run)
    assert (run["input_tokens"], run["output_tokens"]) == (31, 10)
    events = api(people["requester"]).get(f"/api/runs/{finished_run}/events/").json()["results"]
    assert [e["payload"]["step"] for e in events if e["type"] == "model_call"] == [s["id"] for s in steps]


def test_steps_come_in_cursor_pages_oldest_first(people, api, finished_run):
    requester = api(people["requester"])

    first = requester.get(f"/api/runs/{finished_run}/steps/", {"page_size": 1}).json()
    second = requester.get(first["next"]).json()

    assert [s["index"] for s in first["results"] + second["results"]] == [0, 1]
    assert second["next"] is None and second["previous"]
    bad = requester.get(f"/api/runs/{finished_run}/steps/", {"page_size": 0})
    assert bad.status_code == 400 and "page_size" in bad.json()["error"]["details"]["fields"]


def test_steps_are_read_by_those_who_may_read_the_run_and_are_404_to_anyone_else(people, api, client,
                                                                                finished_run):
    path = f"/api/runs/{finished_run}/steps/"
    outsider = get_user_model().objects.create_user("another-requester")

    assert api(people["approver"]).get(path).status_code == 200  # approvers see every run
    assert api(people["admin"]).get(path).status_code == 200
    for status, response in ((404, api(outsider).get(f"/api/runs/{finished_run}/")), (404, api(outsider).get(path)),
                             (404, api(people["requester"]).get("/api/runs/999999/steps/")),
                             (401, client.get(path))):
        assert response.status_code == status
        assert set(response.json()["error"]) == {"code", "message", "details"}
    assert api(outsider).post(path, {}, format="json").status_code == 405


def test_the_schema_documents_the_steps_list_and_its_fields(people, api):
    schema = json.loads(api(people["requester"]).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
                        .content)

    operation = schema["paths"]["/api/runs/{id}/steps/"]["get"]
    assert {p["name"] for p in operation["parameters"]} >= {"id", "cursor", "page_size"}
    page = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    step = schema["components"]["schemas"][page]["properties"]["results"]["items"]["$ref"].rsplit("/", 1)[1]
    fields = schema["components"]["schemas"][step]["properties"]
    assert {"index", "status", "started_at", "finished_at", "input_tokens", "output_tokens", "cost_usd",
            "finish_reason", "error", "server_error"} <= set(fields)
