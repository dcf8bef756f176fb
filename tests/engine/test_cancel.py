"""Cancellation: at once when nothing runs, at the next safe point when a worker is on it."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from approvals.services import reconcile_interrupt
from runs.engine.actors import advance_run
from runs.models import RunStatus
from runs.transitions import apply
from runs.engine.lifecycle import cancel_run, start_run
from tests.support.durability import lookup_agent, make_agent
from tests.support.fake_tools import transfers
from tools import registry
from tools.models import ToolCall, ToolCallStatus
from tools.registry import Tool, ToolTimeout


def test_running_run_is_cancelled_at_its_next_safe_point(people, idle_worker):
    run = start_run(agent=lookup_agent(), user=people["requester"], input="look a up")
    apply(run.start, actor="worker")  # a worker has it
    cancel_run(run=run, actor="user:requester")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.cancel_requested_at is not None

    idle_worker.worker.start()
    advance_run.send(run.pk)
    idle_worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.events.filter(type="transition", to_status="cancelled", reason="cancelled at a safe point").exists()
    assert not run.steps.exists(), "no model call after the cancel request"


def test_cancelling_a_waiting_run_cancels_its_approval_and_call(people, worker):
    agent = make_agent("transfer", [{"tool_calls": [{"name": "fake_transfer",
                                                     "arguments": {"account": "acme", "amount": 50}}]},
                                    {"content": "Sent."}], tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 50 to acme")
    worker.drain()
    cancel_run(run=run, actor="user:requester")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert Interrupt.objects.get(run=run).status == InterruptStatus.CANCELLED
    assert ToolCall.objects.get(run=run, name="fake_transfer").status == ToolCallStatus.CANCELLED
    assert transfers() == []


@pytest.fixture
def cancelled_run(people, worker, api):
    """A run of the requester's that waited for an approval and was cancelled over the API."""
    agent = make_agent("transfer", [{"tool_calls": [{"name": "fake_transfer",
                                                     "arguments": {"account": "acme", "amount": 50}}]},
                                    {"content": "Sent."}], tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 50 to acme")
    worker.drain()
    first = api(people["requester"]).post(f"/api/runs/{run.pk}/cancel/", {}, format="json")
    assert first.status_code == 200 and first.json()["status"] == "cancelled"
    return run, first.json()


def test_a_repeated_cancel_over_the_api_answers_200_with_the_run_unchanged(people, api, cancelled_run):
    run, first = cancelled_run
    events = list(run.events.values_list("seq", flat=True))

    for user in ("requester", "admin"):
        again = api(people[user]).post(f"/api/runs/{run.pk}/cancel/", {}, format="json")
        assert again.status_code == 200
        assert again.json() == first
    assert list(run.events.values_list("seq", flat=True)) == events, "nothing logged, nothing changed"


def test_a_repeated_cancel_on_the_run_page_shows_the_cancelled_run(people, client, cancelled_run):
    run, _first = cancelled_run
    events = run.events.count()
    client.force_login(people["requester"])

    response = client.post(reverse("run-cancel", args=[run.pk]))

    assert (response.status_code, response["Location"]) == (302, reverse("run-detail", args=[run.pk]))
    assert run.events.count() == events


def test_a_repeated_cancel_by_someone_who_may_not_see_the_run_is_still_404(people, api, cancelled_run):
    run, _first = cancelled_run
    outsider = get_user_model().objects.create_user("outsider")
    response = api(outsider).post(f"/api/runs/{run.pk}/cancel/", {}, format="json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


@pytest.fixture
def payout(monkeypatch):
    def handler(ctx, args):
        raise ToolTimeout("bank did not answer")

    monkeypatch.setitem(registry._TOOLS, "payout", Tool(
        name="payout", description="Pay out.", handler=handler, side_effect=True,
        parameters={"type": "object", "properties": {"amount": {"type": "number"}}}))


def test_an_unknown_effect_stays_to_be_reconciled_after_the_run_is_cancelled(people, worker, payout):
    agent = make_agent("payout", [{"tool_calls": [{"name": "payout", "arguments": {"amount": 5}}]},
                                  {"content": "Paid."}], tools=["payout"])
    run = start_run(agent=agent, user=people["requester"], input="pay")
    worker.drain()
    cancel_run(run=run, actor="user:requester")

    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION)
    assert item.status == InterruptStatus.PENDING
    reconcile_interrupt(interrupt=item, user=people["approver"], succeeded=True, result={"paid": 5},
                        evidence="bank: paid at 09:14")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.SUCCEEDED
