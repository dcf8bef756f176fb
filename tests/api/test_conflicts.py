"""Decisions and cancellations that are no longer possible, or not yours to make."""

from decimal import Decimal

import pytest

from approvals.models import Interrupt
from runs.models import Run
from tests.support.api import error_of, get_run, pending_interrupts, start_run, tool_calls
from tests.support.core import core_agent, lookup, transfer
from tests.support.fake_tools import transfers


@pytest.fixture
def waiting_run(worker, people, api):
    """A transfer run of the requester, waiting for approval of its transfer of 80 to acme."""
    agent = core_agent(api(people["admin"]), "conflicts", [
        {"tool_calls": [lookup("acme")]}, {"tool_calls": [transfer("acme", 80)]}, {"content": "Sent 80."},
    ])
    run = start_run(api(people["requester"]), agent["slug"])
    worker.drain()
    interrupt, = pending_interrupts(api(people["approver"]), run["id"])
    return run["id"], interrupt["id"]


def test_second_approval_is_a_conflict_and_changes_nothing(worker, people, api, waiting_run):
    run_id, interrupt_id = waiting_run
    approver = api(people["approver"])
    assert approver.post(f"/api/interrupts/{interrupt_id}/approve/", {}, format="json").status_code == 200
    worker.drain()
    before = Interrupt.objects.get(pk=interrupt_id)
    events_before = Run.objects.get(pk=run_id).events.count()

    again = api(people["admin"]).post(f"/api/interrupts/{interrupt_id}/approve/", {"comment": "me too"}, format="json")

    assert error_of(again, 409)["details"]["status"] == "resolved"
    after = Interrupt.objects.get(pk=interrupt_id)
    assert (after.resolved_by_id, after.comment, after.resolved_at) == (
        before.resolved_by_id, before.comment, before.resolved_at)
    assert Run.objects.get(pk=run_id).events.count() == events_before
    assert len(transfers()) == 1


def test_rejecting_an_approved_item_is_a_conflict(worker, people, api, waiting_run):
    _, interrupt_id = waiting_run
    approver = api(people["approver"])
    approver.post(f"/api/interrupts/{interrupt_id}/approve/", {}, format="json")

    response = approver.post(f"/api/interrupts/{interrupt_id}/reject/", {}, format="json")

    assert response.status_code == 409
    assert Interrupt.objects.get(pk=interrupt_id).decision == "approved"


def test_approval_after_cancel_is_a_conflict_and_nothing_runs(worker, people, api, waiting_run):
    run_id, interrupt_id = waiting_run
    cancelled = api(people["requester"]).post(f"/api/runs/{run_id}/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"

    response = api(people["approver"]).post(f"/api/interrupts/{interrupt_id}/approve/", {}, format="json")
    worker.drain()

    assert error_of(response, 409)["details"]["status"] == "cancelled"
    assert get_run(api(people["requester"]), run_id)["status"] == "cancelled"
    call, = [c for c in tool_calls(api(people["requester"]), run_id) if c["name"] == "fake_transfer"]
    assert call["status"] == "cancelled"
    assert len(transfers()) == 0


def test_cancelling_a_completed_run_is_a_conflict_naming_its_status(worker, people, api):
    agent = core_agent(api(people["admin"]), "quick", [{"tool_calls": [lookup("acme")]}, {"content": "Found acme."}],
                       completion_check="default")
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"], "Look acme up.")
    worker.drain()
    assert get_run(requester, run["id"])["status"] == "completed"

    response = requester.post(f"/api/runs/{run['id']}/cancel/")

    error = error_of(response, 409)
    assert (error["code"], error["details"]["status"]) == ("illegal_transition", "completed")
    assert Run.objects.get(pk=run["id"]).cancel_requested_at is None


def test_requester_without_permission_cannot_approve(worker, people, api, waiting_run):
    run_id, interrupt_id = waiting_run
    requester = api(people["requester"])
    assert pending_interrupts(requester, run_id)[0]["can_decide"] is False

    response = requester.post(f"/api/interrupts/{interrupt_id}/approve/", {}, format="json")

    assert response.status_code == 403
    assert Interrupt.objects.get(pk=interrupt_id).status == "pending"
    assert get_run(requester, run_id)["status"] == "waiting"


def test_edited_arguments_breaking_the_schema_are_refused(worker, people, api, waiting_run):
    _, interrupt_id = waiting_run

    response = api(people["approver"]).post(f"/api/interrupts/{interrupt_id}/approve/",
                                            {"arguments": {"account": "acme", "amount": "all"}}, format="json")

    assert response.status_code == 400
    assert Interrupt.objects.get(pk=interrupt_id).status == "pending"


def test_approval_with_edited_arguments_transfers_the_edited_amount(worker, people, api, waiting_run):
    run_id, interrupt_id = waiting_run

    response = api(people["approver"]).post(f"/api/interrupts/{interrupt_id}/approve/",
                                            {"arguments": {"account": "acme", "amount": 60}}, format="json")
    worker.drain()

    assert response.status_code == 200
    assert response.json()["edited_arguments"] == {"account": "acme", "amount": 60}
    made, = transfers()
    assert Decimal(str(made["amount"])) == 60
    assert get_run(api(people["requester"]), run_id)["status"] == "completed"


def test_non_staff_cannot_create_an_agent(people, api):
    body = {"slug": "sneaky", "name": "Sneaky", "model": {"provider": "scripted", "turns": []}}

    for username in ("requester", "approver"):
        assert api(people[username]).post("/api/agents/", body, format="json").status_code == 403
    assert api(people["requester"]).get("/api/agents/sneaky/").status_code == 404
