"""A run's outcome is what its tool calls did, never what the model says (default check and domain checks)."""

import pytest

from runs.engine.completion import achieved, register_check
from tests.support.api import get_run, pending_interrupts, start_run, tool_calls
from tests.support.core import CORE_TOOLS, core_agent, lookup, transfer
from tests.support.fake_tools import transfers


def default_agent(admin, slug, turns, **extra):
    """An integrator's agent: no completion check named, so it gets ``default``."""
    body = {"slug": slug, "name": slug, "model": {"provider": "scripted", "turns": turns},
            "tools": CORE_TOOLS, **extra}
    response = admin.post("/api/agents/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["completion_check"] == extra.get("completion_check", "default")
    return response.json()


def test_transfer_refused_by_the_precondition_is_not_achieved_whatever_the_model_says(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = default_agent(admin, "denied-default", [{"tool_calls": [transfer("acme", 500)]},
                                                    {"content": "Transfer made."}])

    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    call, = tool_calls(requester, run["id"])
    assert call["status"] == "denied"
    assert (run["status"], run["outcome"]) == ("completed", "not_achieved")
    assert run["outcome_reason"].startswith(f"fake_transfer #{call['id']} denied: ")
    assert "at most 100.00 more can be transferred" in run["outcome_reason"]
    assert run["final_output"] == "Transfer made."  # the model's words are kept, as its words
    assert transfers() == []


def test_transfer_rejected_by_a_person_is_not_achieved_and_the_reason_quotes_the_comment(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = default_agent(admin, "rejected-default", [
        {"tool_calls": [lookup("acme")]}, {"tool_calls": [transfer("acme", 60)]}, {"content": "Transfer made."}])
    run = start_run(requester, agent["slug"])
    worker.drain()
    item, = pending_interrupts(approver, run["id"])

    response = approver.post(f"/api/interrupts/{item['id']}/reject/", {"comment": "not eligible"}, format="json")
    assert response.status_code == 200, response.json()
    worker.drain()

    run = get_run(requester, run["id"])
    call = next(c for c in tool_calls(requester, run["id"]) if c["name"] == "fake_transfer")
    assert (run["status"], run["outcome"]) == ("completed", "not_achieved")
    assert run["outcome_reason"].startswith(f"fake_transfer #{call['id']} rejected")
    assert "not eligible" in run["outcome_reason"]
    assert transfers() == []


def test_transfer_that_succeeded_is_achieved(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = default_agent(admin, "transfer-ok", [{"tool_calls": [transfer("acme", 5)]}, {"content": "Transfer made."}])
    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    call, = tool_calls(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    assert run["outcome_reason"] == f"done: fake_transfer #{call['id']} succeeded"
    assert len(transfers()) == 1


def test_facts_beat_words_a_model_that_says_it_failed_while_its_transfer_succeeded_is_achieved(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = default_agent(admin, "modest-model", [
        {"tool_calls": [transfer("acme", 5)]}, {"content": "I could not do it, sorry."}])
    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"], run["final_output"]) == ("completed", "achieved", "I could not do it, sorry.")


def test_a_domain_check_cannot_overrule_the_floor_without_saying_why(worker, people, api):
    # The fake tools' transfer check: achieved once any transfer succeeded. A later
    # transfer that was denied and never superseded still makes it not achieved.
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = core_agent(admin, "domain-floor", [
        {"tool_calls": [transfer("acme", 5)]}, {"tool_calls": [lookup("globex"), transfer("globex", 500)]},
        {"content": "Both transfers made."}])
    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    denied = next(c for c in tool_calls(requester, run["id"]) if c["status"] == "denied")
    assert (run["status"], run["outcome"]) == ("completed", "not_achieved")
    assert run["outcome_reason"].startswith(f"fake_transfer #{denied['id']} denied")


@pytest.fixture
def lenient_check():
    @register_check("test-lenient")
    def lenient(run):
        return achieved("the customer was told", despite="a refused transfer is an acceptable answer here")

    yield "test-lenient"
    from runs.engine import completion
    completion._CHECKS.pop("test-lenient")


def test_a_domain_check_that_says_why_may_overrule_the_floor_and_the_reason_keeps_both(
        worker, people, api, lenient_check):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = default_agent(admin, "lenient", [{"tool_calls": [transfer("acme", 500)]}, {"content": "Told them no."}],
                          completion_check=lenient_check)
    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    assert "the customer was told, despite fake_transfer #" in run["outcome_reason"]
    assert "a refused transfer is an acceptable answer here" in run["outcome_reason"]


def test_an_agent_naming_an_unregistered_completion_check_is_refused(people, api):
    admin = api(people["admin"])
    body = {"slug": "no-such-check", "name": "x", "model": {"provider": "scripted", "turns": [{"content": "hi"}]},
            "completion_check": "no-such-check"}
    response = admin.post("/api/agents/", body, format="json")
    assert response.status_code == 400
    assert "no-such-check" in str(response.json())


def test_the_outcome_reason_is_in_the_live_update_and_the_run_page(worker, people, api, client):
    from runs.live import run_snapshot
    from runs.models import Run

    admin, requester = api(people["admin"]), api(people["requester"])
    agent = default_agent(admin, "page-reason", [{"tool_calls": [transfer("acme", 500)]},
                                                 {"content": "Transfer made."}])
    run = start_run(requester, agent["slug"])
    worker.drain()

    snapshot = run_snapshot(Run.objects.get(pk=run["id"]))
    assert snapshot["outcome"] == "not_achieved" and "denied" in snapshot["outcome_reason"]
    client.force_login(people["requester"])
    page = client.get(f"/runs/{run['id']}/").content.decode()
    verdict = page[page.index('id="run-verdict"'):page.index('id="run-final-output"')]
    assert "not achieved" in verdict and "denied" in verdict
    listing = client.get("/runs/").content.decode()
    assert "at most 100.00 more can be transferred" in listing


def test_a_transfer_to_another_account_does_not_make_up_for_a_refused_one(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = default_agent(admin, "other-account", [
        {"tool_calls": [transfer("acme", 500)]}, {"tool_calls": [transfer("globex", 5)]}, {"content": "Both done."}])
    run = start_run(requester, agent["slug"])
    worker.drain()
    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "not_achieved")
    assert "denied" in run["outcome_reason"]


def test_a_call_of_a_tool_the_agent_does_not_have_is_ignored_like_an_invented_one(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    agent = default_agent(admin, "withheld-tool", [  # a registered tool this agent was not given
        {"tool_calls": [transfer("acme", 5)]},
        {"tool_calls": [lookup("acme")]}, {"content": "Looked it up."}], tools=["fake_lookup"])
    run = start_run(requester, agent["slug"])
    worker.drain()
    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
