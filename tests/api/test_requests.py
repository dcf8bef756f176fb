"""Request validation, visibility and the read-only endpoints of the REST API."""

import json

import pytest
from django.conf import settings as django_settings

from config.idempotency import REPLAYED_HEADER
from runs.engine.lifecycle import SubmitOutcome, submit_input
from runs.models import Agent, Run, RunStatus
from tests.support.api import error_of, field_errors, start_run
from tests.support.core import lookup
from tests.support.durability import make_agent

SCRIPT = {"provider": "scripted", "turns": [{"tool_calls": [lookup("acme")]}, {"content": "Done."}]}


# --- starting runs --------------------------------------------------------------

def test_unknown_agent_slug_is_a_bad_request(people, api):
    response = api(people["requester"]).post("/api/runs/", {"agent": "no-such-agent", "input": "hi"}, format="json")

    assert "agent" in field_errors(response)
    assert not Run.objects.exists()


def test_input_over_the_limit_is_a_bad_request(people, api, settings, asking):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_INPUT_CHARS": 100}

    response = api(people["requester"]).post("/api/runs/", {"agent": asking, "input": "x" * 101},
                                             format="json")

    assert "limit is 100" in field_errors(response)["input"][0]
    assert not Run.objects.exists()


def test_body_over_the_upload_limit_is_refused_as_too_large(people, api, asking):
    text = "x" * (django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)

    response = api(people["requester"]).post("/api/runs/", json.dumps({"agent": asking, "input": text}),
                                             content_type="application/json")

    error = error_of(response, 413)
    assert (error["code"], error["details"]["limit_bytes"]) == ("too_large", django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    assert not Run.objects.exists()


def test_another_users_session_cannot_be_continued(people, api, outsider, asking):
    run = start_run(api(people["requester"]), asking)

    response = api(outsider).post("/api/runs/", {"agent": asking, "input": "hi", "session": run["session"]},
                                  format="json")

    assert "session" in field_errors(response)
    assert Run.objects.count() == 1


def test_submit_input_says_what_it_did_as_a_submit_outcome_and_the_api_answers_201_or_200_by_it(people, api):
    requester, agent = people["requester"], make_agent("plain", [{"content": "Done."}], tools=[])
    created = submit_input(agent=agent, user=requester, input="Send 80 to acme.", idempotency_key="s-1")
    run = created.run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)  # the session's run is busy
    joined = submit_input(agent=agent, user=requester, input="it was a gift", session=run.session,
                          multitask_strategy="supplement", idempotency_key="s-2")
    assert [(s.outcome, s.replayed, s.run.pk) for s in (created, joined)] == [
        (SubmitOutcome.CREATED, False, run.pk), (SubmitOutcome.SUPPLEMENTED, False, run.pk)]
    assert {type(s.outcome) for s in (created, joined)} == {SubmitOutcome}

    # The same two requests through the API: replayed from the run's events, answered as before.
    bodies = {"s-1": {"agent": "plain", "input": "Send 80 to acme."},
              "s-2": {"agent": "plain", "input": "it was a gift", "session": run.session_id,
                      "multitask_strategy": "supplement"}}
    answers = [api(requester).post("/api/runs/", body, format="json", headers={"Idempotency-Key": key})
               for key, body in bodies.items()]
    assert [(a.status_code, a.json()["id"], a.headers.get(REPLAYED_HEADER)) for a in answers] == [
        (201, run.pk, "true"), (200, run.pk, "true")]
    assert Run.objects.count() == 1 and run.messages.filter(content="it was a gift").count() == 1


def test_overlong_idempotency_key_is_a_bad_request(people, api, asking):
    response = api(people["requester"]).post("/api/runs/", {"agent": asking, "input": "hi"}, format="json",
                                             headers={"Idempotency-Key": "k" * 201})

    assert response.status_code == 400
    assert not Run.objects.exists()


def test_anonymous_requests_are_refused(people, client, asking):
    assert client.get("/api/runs/").status_code in (401, 403)
    assert client.post("/api/runs/", {"agent": asking, "input": "hi"}).status_code in (401, 403)


# --- visibility -----------------------------------------------------------------

def test_users_see_only_their_own_runs_and_items(people, api, outsider, asking):
    run = start_run(api(people["requester"]), asking)
    client = api(outsider)

    assert client.get("/api/runs/").json()["results"] == []
    for path in ("", "events/", "tool-calls/"):
        assert client.get(f"/api/runs/{run['id']}/{path}").status_code == 404
    assert client.get("/api/interrupts/").json()["results"] == []


def test_approvers_and_staff_see_every_run(people, api, asking):
    run = start_run(api(people["requester"]), asking)

    for username in ("approver", "admin"):
        listed = api(people[username]).get("/api/runs/").json()["results"]
        assert [r["id"] for r in listed] == [run["id"]]
        assert listed[0]["requested_by"] == "requester"


def test_only_requester_staff_and_approvers_may_cancel(people, api, outsider, asking):
    run = start_run(api(people["requester"]), asking)

    response = api(outsider).post(f"/api/runs/{run['id']}/cancel/")

    assert response.status_code == 404, "another user's run is not found, as a missing one"
    assert Run.objects.get(pk=run["id"]).status == "queued"
    response = api(people["approver"]).post(f"/api/runs/{run['id']}/cancel/")
    assert (response.status_code, response.json()["status"]) == (200, "cancelled")
    actors = Run.objects.get(pk=run["id"]).events.filter(to_status="cancelled").values_list("actor", flat=True)
    assert list(actors) == ["user:approver"]


def test_interrupt_filters_are_validated(people, api):
    client = api(people["approver"])

    assert client.get("/api/interrupts/", {"status": "pending"}).status_code == 200
    assert client.get("/api/interrupts/", {"status": "done"}).status_code == 400
    assert client.get("/api/interrupts/", {"run": "x"}).status_code == 400


# --- agents ---------------------------------------------------------------------

def test_staff_creates_an_agent_with_defaults(people, api):
    response = api(people["admin"]).post("/api/agents/", {"slug": "lookup", "name": "Lookup", "model": SCRIPT},
                                         format="json")

    assert response.status_code == 201, response.json()
    agent = Agent.objects.get(slug="lookup")
    assert (agent.tools, agent.completion_check, agent.max_turns, agent.approval_policy) == ([], "default", 20, {})


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"tools": ["fake_lookup", "launch_rockets"]}, "tools", "launch_rockets"),
    ({"completion_check": "vibes"}, "completion_check", "vibes"),
    ({"approval_policy": {"fake_transfer": "amount >> 5"}}, "approval_policy", "amount >> 5"),
    ({"approval_policy": {"launch_rockets": "always"}}, "approval_policy", "launch_rockets"),
    ({"model": {"provider": "oracle"}}, "model", "oracle"),
    ({"model": {"provider": "scripted"}}, "model", "turns"),
    ({"model": {"provider": "scripted", "turns": ["hello"]}}, "model", "Turn 1"),
    ({"model": {"provider": "openai"}}, "model", "'model' name"),
    ({"model": "gpt"}, "model", "object"),
    ({"slug": "send-80"}, "slug", "already exists"),  # the ``asking`` agent's slug
    ({"slug": "not a slug"}, "slug", "slug"),
    ({"max_turns": 0}, "max_turns", ""),
])
def test_invalid_agent_definitions_are_refused_naming_the_problem(people, api, asking, change, field, message):
    body = {"slug": "new-agent", "name": "New agent", "model": SCRIPT, **change}

    response = api(people["admin"]).post("/api/agents/", body, format="json")

    assert message in " ".join(field_errors(response)[field])
    assert not Agent.objects.filter(slug="new-agent").exists()


def test_an_openai_agent_can_be_defined_before_its_key_is_set(people, api):
    model = {"provider": "openai", "model": "gpt-4o-mini", "endpoint": "openai"}

    response = api(people["admin"]).post("/api/agents/", {"slug": "gpt", "name": "GPT", "model": model}, format="json")

    assert response.status_code == 201, response.json()


def test_anyone_signed_in_lists_agents(people, api, asking, refused):
    agents = api(people["requester"]).get("/api/agents/").json()["results"]

    assert {asking, refused} <= {a["slug"] for a in agents}


def test_agent_credentials_are_masked_for_everyone(people, api):
    # A row written before endpoint profiles existed (the API refuses such keys now).
    Agent.objects.create(slug="keyed", name="Keyed", model={"provider": "openai", "model": "m", "api_key": "sk-secret"})

    assert api(people["requester"]).get("/api/agents/keyed/").json()["model"]["api_key"] == "***"
    assert api(people["admin"]).get("/api/agents/keyed/").json()["model"]["api_key"] == "***"


# --- tools and schema -------------------------------------------------------------

def test_tools_list_their_schema_and_policy(people, api):
    page = api(people["requester"]).get("/api/tools/").json()
    assert (page["next"], page["previous"]) == (None, None)
    tools = {t["name"]: t for t in page["results"]}

    transfer = tools["fake_transfer"]
    assert (transfer["side_effect"], transfer["approval"]) == (True, "amount > 10")
    assert (transfer["target_key"], transfer["requester_may_decide"]) == ("account", False)
    assert transfer["parameters"]["required"] == ["account", "amount"]
    assert tools["fake_lookup"]["side_effect"] is False
    assert transfer["timeout_s"] > 0


def test_openapi_schema_describes_the_api(people, api):
    response = api(people["requester"]).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    for path in ("/api/runs/", "/api/runs/{id}/events/", "/api/runs/{id}/cancel/", "/api/interrupts/{id}/approve/",
                 "/api/agents/", "/api/tools/"):
        assert path in paths
