"""Request validation, visibility and the read-only endpoints of the REST API."""

import json

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model

from config.idempotency import REPLAYED_HEADER
from runs.engine.lifecycle import SubmitOutcome, submit_input
from runs.models import Agent, Run, RunStatus
from tests.support.api import QUERY_CALL, error_of, field_errors, start_run
from tests.support.durability import make_agent

SCRIPT = {"provider": "scripted", "turns": [{"tool_calls": [QUERY_CALL]}, {"content": "Done."}]}


@pytest.fixture
def outsider(demo):
    return get_user_model().objects.create_user("outsider", password="x")


# --- starting runs --------------------------------------------------------------

def test_unknown_agent_slug_is_a_bad_request(demo, api):
    response = api(demo["requester"]).post("/api/runs/", {"agent": "no-such-agent", "input": "hi"}, format="json")

    assert "agent" in field_errors(response)
    assert not Run.objects.exists()


def test_input_over_the_limit_is_a_bad_request(demo, api, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_INPUT_CHARS": 100}

    response = api(demo["requester"]).post("/api/runs/", {"agent": "refund-order", "input": "x" * 101},
                                           format="json")

    assert "limit is 100" in field_errors(response)["input"][0]
    assert not Run.objects.exists()


def test_body_over_the_upload_limit_is_refused_as_too_large(demo, api):
    text = "x" * (django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)

    response = api(demo["requester"]).post("/api/runs/", json.dumps({"agent": "refund-order", "input": text}),
                                           content_type="application/json")

    error = error_of(response, 413)
    assert (error["code"], error["details"]["limit_bytes"]) == ("too_large", django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    assert not Run.objects.exists()


def test_another_users_session_cannot_be_continued(demo, api, outsider):
    run = start_run(api(demo["requester"]), "refund-order")

    response = api(outsider).post("/api/runs/", {"agent": "refund-order", "input": "hi", "session": run["session"]},
                                  format="json")

    assert "session" in field_errors(response)
    assert Run.objects.count() == 1


def test_submit_input_says_what_it_did_as_a_submit_outcome_and_the_api_answers_201_or_200_by_it(people, api):
    requester, agent = people["requester"], make_agent("plain", [{"content": "Done."}], tools=[])
    created = submit_input(agent=agent, user=requester, input="refund 123", idempotency_key="s-1")
    run = created.run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)  # the session's run is busy
    joined = submit_input(agent=agent, user=requester, input="it was a gift", session=run.session,
                          multitask_strategy="supplement", idempotency_key="s-2")
    assert [(s.outcome, s.replayed, s.run.pk) for s in (created, joined)] == [
        (SubmitOutcome.CREATED, False, run.pk), (SubmitOutcome.SUPPLEMENTED, False, run.pk)]
    assert {type(s.outcome) for s in (created, joined)} == {SubmitOutcome}

    # The same two requests through the API: replayed from the run's events, answered as before.
    bodies = {"s-1": {"agent": "plain", "input": "refund 123"},
              "s-2": {"agent": "plain", "input": "it was a gift", "session": run.session_id,
                      "multitask_strategy": "supplement"}}
    answers = [api(requester).post("/api/runs/", body, format="json", headers={"Idempotency-Key": key})
               for key, body in bodies.items()]
    assert [(a.status_code, a.json()["id"], a.headers.get(REPLAYED_HEADER)) for a in answers] == [
        (201, run.pk, "true"), (200, run.pk, "true")]
    assert Run.objects.count() == 1 and run.messages.filter(content="it was a gift").count() == 1


def test_overlong_idempotency_key_is_a_bad_request(demo, api):
    response = api(demo["requester"]).post("/api/runs/", {"agent": "refund-order", "input": "hi"}, format="json",
                                           headers={"Idempotency-Key": "k" * 201})

    assert response.status_code == 400
    assert not Run.objects.exists()


def test_anonymous_requests_are_refused(demo, client):
    assert client.get("/api/runs/").status_code in (401, 403)
    assert client.post("/api/runs/", {"agent": "refund-order", "input": "hi"}).status_code in (401, 403)


# --- visibility -----------------------------------------------------------------

def test_users_see_only_their_own_runs_and_items(demo, api, outsider):
    run = start_run(api(demo["requester"]), "refund-order")
    client = api(outsider)

    assert client.get("/api/runs/").json()["results"] == []
    for path in ("", "events/", "tool-calls/"):
        assert client.get(f"/api/runs/{run['id']}/{path}").status_code == 404
    assert client.get("/api/interrupts/").json()["results"] == []


def test_approvers_and_staff_see_every_run(demo, api):
    run = start_run(api(demo["requester"]), "refund-order")

    for username in ("approver", "admin"):
        listed = api(demo[username]).get("/api/runs/").json()["results"]
        assert [r["id"] for r in listed] == [run["id"]]
        assert listed[0]["requested_by"] == "requester"


def test_only_requester_staff_and_approvers_may_cancel(demo, api, outsider):
    run = start_run(api(demo["requester"]), "refund-order")

    response = api(outsider).post(f"/api/runs/{run['id']}/cancel/")

    assert response.status_code == 404, "another user's run is not found, as a missing one"
    assert Run.objects.get(pk=run["id"]).status == "queued"
    response = api(demo["approver"]).post(f"/api/runs/{run['id']}/cancel/")
    assert (response.status_code, response.json()["status"]) == (200, "cancelled")
    actors = Run.objects.get(pk=run["id"]).events.filter(to_status="cancelled").values_list("actor", flat=True)
    assert list(actors) == ["user:approver"]


def test_interrupt_filters_are_validated(demo, api):
    client = api(demo["approver"])

    assert client.get("/api/interrupts/", {"status": "pending"}).status_code == 200
    assert client.get("/api/interrupts/", {"status": "done"}).status_code == 400
    assert client.get("/api/interrupts/", {"run": "x"}).status_code == 400


# --- agents ---------------------------------------------------------------------

def test_staff_creates_an_agent_with_defaults(demo, api):
    response = api(demo["admin"]).post("/api/agents/", {"slug": "lookup", "name": "Lookup", "model": SCRIPT},
                                       format="json")

    assert response.status_code == 201, response.json()
    agent = Agent.objects.get(slug="lookup")
    assert (agent.tools, agent.completion_check, agent.max_turns, agent.approval_policy) == ([], "default", 20, {})


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"tools": ["query_order", "launch_rockets"]}, "tools", "launch_rockets"),
    ({"completion_check": "vibes"}, "completion_check", "vibes"),
    ({"approval_policy": {"refund": "amount >> 5"}}, "approval_policy", "amount >> 5"),
    ({"approval_policy": {"launch_rockets": "always"}}, "approval_policy", "launch_rockets"),
    ({"model": {"provider": "oracle"}}, "model", "oracle"),
    ({"model": {"provider": "scripted"}}, "model", "turns"),
    ({"model": {"provider": "scripted", "turns": ["hello"]}}, "model", "Turn 1"),
    ({"model": {"provider": "openai"}}, "model", "'model' name"),
    ({"model": "gpt"}, "model", "object"),
    ({"slug": "refund-order"}, "slug", "already exists"),
    ({"slug": "not a slug"}, "slug", "slug"),
    ({"max_turns": 0}, "max_turns", ""),
])
def test_invalid_agent_definitions_are_refused_naming_the_problem(demo, api, change, field, message):
    body = {"slug": "new-agent", "name": "New agent", "model": SCRIPT, **change}

    response = api(demo["admin"]).post("/api/agents/", body, format="json")

    assert message in " ".join(field_errors(response)[field])
    assert not Agent.objects.filter(slug="new-agent").exists()


def test_an_openai_agent_can_be_defined_before_its_key_is_set(demo, api):
    model = {"provider": "openai", "model": "gpt-4o-mini", "endpoint": "openai"}

    response = api(demo["admin"]).post("/api/agents/", {"slug": "gpt", "name": "GPT", "model": model}, format="json")

    assert response.status_code == 201, response.json()


def test_anyone_signed_in_lists_agents(demo, api):
    agents = api(demo["requester"]).get("/api/agents/").json()["results"]

    assert {"refund-order", "cancel-order", "send-contract-email"} <= {a["slug"] for a in agents}


def test_agent_credentials_are_masked_for_everyone(demo, api):
    # A row written before endpoint profiles existed (the API refuses such keys now).
    Agent.objects.create(slug="keyed", name="Keyed", model={"provider": "openai", "model": "m", "api_key": "sk-secret"})

    assert api(demo["requester"]).get("/api/agents/keyed/").json()["model"]["api_key"] == "***"
    assert api(demo["admin"]).get("/api/agents/keyed/").json()["model"]["api_key"] == "***"


# --- tools and schema -------------------------------------------------------------

def test_tools_list_their_schema_and_policy(demo, api):
    page = api(demo["requester"]).get("/api/tools/").json()
    assert (page["next"], page["previous"]) == (None, None)
    tools = {t["name"]: t for t in page["results"]}

    refund = tools["refund"]
    assert (refund["side_effect"], refund["approval"]) == (True, "sum(amount) per target within 30d > 50")
    assert (refund["target_key"], refund["requester_may_decide"]) == ("order_id", False)
    assert refund["parameters"]["required"] == ["order_id", "amount"]
    assert tools["query_order"]["side_effect"] is False
    assert refund["timeout_s"] > 0


def test_openapi_schema_describes_the_api(demo, api):
    response = api(demo["requester"]).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    for path in ("/api/runs/", "/api/runs/{id}/events/", "/api/runs/{id}/cancel/", "/api/interrupts/{id}/approve/",
                 "/api/agents/", "/api/tools/"):
        assert path in paths
