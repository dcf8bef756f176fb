"""A new input while the session's run is active: enqueue, supplement, interrupt or reject (docs/design.md#multitask)."""

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.models import Agent, Run, RunStatus
from runs.engine.lifecycle import start_run
from tests.support.api import error_of


def _busy_session(demo, worker):
    first = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"], input="refund 123")
    worker.drain()
    first.refresh_from_db()
    assert first.status == RunStatus.WAITING
    return first


def _post(api, demo, first, strategy, text="and also this"):
    return api(demo["requester"]).post("/api/runs/", {
        "agent": "refund-order", "input": text, "session": first.session_id, "multitask_strategy": strategy,
    }, format="json")


def test_enqueued_input_runs_after_the_active_run_ends(demo, worker, api):
    first = _busy_session(demo, worker)
    response = _post(api, demo, first, "enqueue", "second request")
    assert response.status_code == 201
    second = Run.objects.get(pk=response.json()["id"])
    worker.drain()
    second.refresh_from_db()
    assert second.status == RunStatus.QUEUED and not second.steps.exists()
    assert not first.messages.filter(content="second request").exists(), "not in the busy run's context"

    decide_interrupt(interrupt=Interrupt.objects.get(run=first), user=demo["approver"], decision="rejected")
    worker.drain()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == RunStatus.COMPLETED
    assert second.status == RunStatus.WAITING and second.steps.exists()
    history = list(first.session.messages.values_list("run_id", flat=True))
    assert history.index(second.pk) > max(i for i, run_id in enumerate(history) if run_id == first.pk)


def test_enqueue_is_the_default(demo, worker, api):
    first = _busy_session(demo, worker)
    response = api(demo["requester"]).post("/api/runs/", {
        "agent": "refund-order", "input": "again", "session": first.session_id}, format="json")
    assert response.status_code == 201
    assert Run.objects.get(pk=response.json()["id"]).status == RunStatus.QUEUED


def test_supplement_joins_the_busy_runs_conversation(demo, worker, api):
    first = _busy_session(demo, worker)
    response = _post(api, demo, first, "supplement", "please hurry")
    assert response.status_code == 200 and response.json()["id"] == first.pk
    assert Run.objects.filter(session=first.session).count() == 1
    assert first.messages.filter(role="user", content="please hurry").exists()
    assert first.events.filter(type="input", reason="supplemented", actor="user:requester").exists()


def test_interrupt_cancels_the_active_run_and_starts_a_new_one(demo, worker, api, payment_gateway):
    first = _busy_session(demo, worker)
    response = _post(api, demo, first, "interrupt", "never mind, new request")
    assert response.status_code == 201
    worker.drain()
    first.refresh_from_db()
    second = Run.objects.get(pk=response.json()["id"])
    assert first.status == RunStatus.CANCELLED
    assert first.events.filter(reason="interrupted by a new input").exists()
    assert second.status == RunStatus.WAITING
    assert payment_gateway.ledger()["refunds"] == []


def test_reject_answers_409_naming_the_active_run(demo, worker, api):
    first = _busy_session(demo, worker)
    response = _post(api, demo, first, "reject")
    error = error_of(response, 409)
    assert (error["code"], error["details"]["active_run"]) == ("session_busy", first.pk)
    assert Run.objects.filter(session=first.session).count() == 1


def test_unknown_strategy_is_a_400(demo, worker, api):
    first = _busy_session(demo, worker)
    assert _post(api, demo, first, "shout").status_code == 400
