"""POST /api/runs/{id}/retry/: a new run of the same session and input; done side effects are not done again."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Interrupt
from runs.models import Agent, Run
from tests.support.api import pending_interrupts, start_run
from tests.support.core import core_agent, lookup
from tests.support.fake_tools import transfer_bank, transfer_keys, transfers
from tools.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def failed_after_transfer(worker, people, api, monkeypatch):
    """A transfer run that transferred (approved, 80 to acme) and then failed: its model gave out. Its
    ``bank`` attribute is the ``TransferBank`` that took the transfer."""
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    bank = transfer_bank(monkeypatch)
    transfer_80 = {"name": "fake_transfer", "arguments": json.dumps({"account": "acme", "amount": 80})}
    agent = core_agent(admin, "flaky-transfer", [{"tool_calls": [lookup("acme")]}, {"tool_calls": [transfer_80]}])
    run = start_run(requester, agent["slug"])
    worker.drain()
    item, = pending_interrupts(approver, run["id"])
    assert approver.post(f"/api/interrupts/{item['id']}/approve/", {}, format="json").status_code == 200
    worker.drain()
    failed = Run.objects.get(pk=run["id"])
    assert (failed.status, failed.failure_type) == ("failed", "model_error")
    assert len(transfers()) == 1
    failed.bank = bank
    return failed


def test_retrying_a_failed_transfer_run_charges_once_in_all(worker, people, api, failed_after_transfer):
    requester = api(people["requester"])
    # The model is back (its script now ends with an answer); the requester retries.
    agent = Agent.objects.get(slug="flaky-transfer")
    agent.model = {**agent.model, "turns": [*agent.model["turns"], {"content": "Transfer made."}]}
    agent.save()

    response = requester.post(f"/api/runs/{failed_after_transfer.pk}/retry/", {}, format="json")
    assert response.status_code == 201, response.json()
    retry = response.json()
    assert (retry["retry_of"], retry["session"], retry["input"], retry["status"]) == (
        failed_after_transfer.pk, failed_after_transfer.session_id, failed_after_transfer.input, "queued")
    worker.drain()

    done = Run.objects.get(pk=retry["id"])
    assert (done.status, done.outcome) == ("completed", "achieved")
    old_transfer = ToolCall.objects.get(run=failed_after_transfer, name="fake_transfer")
    new_transfer = ToolCall.objects.get(run=done, name="fake_transfer")
    assert (new_transfer.status, new_transfer.duplicate_of_id, new_transfer.result) == (
        "succeeded", old_transfer.pk, old_transfer.result)
    assert new_transfer.attempts == 0  # answered with the stored result, never sent
    new_lookup = ToolCall.objects.get(run=done, name="fake_lookup")
    assert (new_lookup.status, new_lookup.attempts) == ("succeeded", 1)  # reads run again
    assert not Interrupt.objects.filter(run=done).exists()  # nobody is asked to approve it again
    key, = transfer_keys()
    assert failed_after_transfer.bank.sends == {key: 1}


def test_only_failed_or_cancelled_runs_of_your_own_can_be_retried(worker, people, api, failed_after_transfer):
    requester = api(people["requester"])
    assert api(people["approver"]).post(f"/api/runs/{failed_after_transfer.pk}/retry/", {},
                                        format="json").status_code == 403
    assert requester.post(f"/api/runs/{failed_after_transfer.pk}/retry/", {"input": "x"},
                          format="json").status_code == 400
    waiting = requester.post("/api/runs/", {"agent": "flaky-transfer", "input": "Later.",
                                            "start_at": (timezone.now() + timedelta(days=1)).isoformat()}, format="json").json()
    assert waiting["status"] == "queued"
    conflict = requester.post(f"/api/runs/{waiting['id']}/retry/", {}, format="json")
    assert conflict.status_code == 409
    assert Run.objects.filter(retry_of__isnull=False).count() == 0

    assert requester.post(f"/api/runs/{waiting['id']}/cancel/", {}, format="json").status_code == 200
    first = requester.post(f"/api/runs/{waiting['id']}/retry/", {}, format="json", headers={"Idempotency-Key": "r1"})
    again = requester.post(f"/api/runs/{waiting['id']}/retry/", {}, format="json", headers={"Idempotency-Key": "r1"})
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.filter(retry_of_id=waiting["id"]).count() == 1


@pytest.fixture
def unreachable_booking(people, settings, monkeypatch):
    """``book_room``: a side-effecting HTTP tool (no approval, ``max_attempts`` 2) of a service whose port
    nobody listens on, so no attempt ever connects; and a run of an agent that books, then answers."""
    import socket

    from runs.engine.lifecycle import start_run
    from runs.webhooks.delivery import new_secret
    from tests.support.durability import make_agent
    from tools import registry
    from tools.http import http_tool

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("BOOKINGS_TOOLS_SECRET", new_secret())
    settings.TOLLGATE = {**settings.TOLLGATE, "TOOL_ENDPOINTS": {"bookings": {
        "base_url": f"http://127.0.0.1:{port}", "secret_env": "BOOKINGS_TOOLS_SECRET",
        "allowed_hosts": ["127.0.0.1"], "allow_http": True}}}

    def declare(**fields):
        tool = http_tool(name="book_room", description="Book a room.", endpoint="bookings", path="/tools/book",
                         parameters={"type": "object", "properties": {"room": {"type": "integer"}}},
                         side_effect=True, approval="never", max_attempts=2, **fields)
        monkeypatch.setitem(registry._TOOLS, tool.name, tool)
        agent = make_agent("booker", [{"tool_calls": [{"name": "book_room", "arguments": {"room": 4}}]},
                                      {"content": "Could not book."}], tools=["book_room"])
        return start_run(agent=agent, user=people["requester"], input="Book room 4.")

    return declare


def test_a_side_effect_never_sent_in_any_attempt_fails_when_they_run_out_and_the_run_goes_on(
        worker, unreachable_booking):
    """Every attempt was ``ToolNotSent`` (the connection was refused): nothing can have happened, so the call
    is ``failed`` (the model is told), never ``unknown`` waiting for a reconciliation."""
    run = unreachable_booking(backoff_s=0.01)
    worker.drain()

    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.attempts) == ("failed", 2)
    assert "nothing was sent" in call.error
    assert (run.status, run.final_output) == ("completed", "Could not book.")
    assert not Interrupt.objects.filter(run=run).exists()


def test_a_side_effect_never_sent_is_cancelled_not_unknown_when_its_run_is_cancelled_during_the_backoff(
        worker, unreachable_booking, api, people):
    run = unreachable_booking(backoff_s=600)  # the run waits retry_backoff (a timer) after the first attempt
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.waiting_reason) == ("waiting", "retry_backoff")

    assert api(people["admin"]).post(f"/api/runs/{run.pk}/cancel/", {}, format="json").status_code == 200
    worker.drain()
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert (run.status, call.status, call.attempts) == ("cancelled", "cancelled", 1)
    assert not Interrupt.objects.filter(run=run).exists()
