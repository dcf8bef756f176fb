"""A new input while the session's run is active: enqueue, supplement, interrupt or reject (docs/design.md#multitask)."""

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.models import Run, RunStatus
from runs.engine.lifecycle import start_run
from tests.support.api import error_of
from tests.support.core import asking_agent
from tests.support.fake_tools import transfers


def _busy_session(people, worker):
    first = start_run(agent=asking_agent(), user=people["requester"], input="send 80 to acme")
    worker.drain()
    first.refresh_from_db()
    assert first.status == RunStatus.WAITING
    return first


def _post(api, people, first, strategy, text="and also this"):
    return api(people["requester"]).post("/api/runs/", {
        "agent": asking_agent().slug, "input": text, "session": first.session_id, "multitask_strategy": strategy,
    }, format="json")


def test_enqueued_input_runs_after_the_active_run_ends(people, worker, api):
    first = _busy_session(people, worker)
    response = _post(api, people, first, "enqueue", "second request")
    assert response.status_code == 201
    second = Run.objects.get(pk=response.json()["id"])
    worker.drain()
    second.refresh_from_db()
    assert second.status == RunStatus.QUEUED and not second.steps.exists()
    assert not first.messages.filter(content="second request").exists(), "not in the busy run's context"

    decide_interrupt(interrupt=Interrupt.objects.get(run=first), user=people["approver"], decision="rejected")
    worker.drain()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == RunStatus.COMPLETED
    assert second.status == RunStatus.WAITING and second.steps.exists()
    history = list(first.session.messages.values_list("run_id", flat=True))
    assert history.index(second.pk) > max(i for i, run_id in enumerate(history) if run_id == first.pk)


def test_enqueue_is_the_default(people, worker, api):
    first = _busy_session(people, worker)
    response = api(people["requester"]).post("/api/runs/", {
        "agent": asking_agent().slug, "input": "again", "session": first.session_id}, format="json")
    assert response.status_code == 201
    assert Run.objects.get(pk=response.json()["id"]).status == RunStatus.QUEUED


def test_supplement_joins_the_busy_runs_conversation(people, worker, api):
    first = _busy_session(people, worker)
    response = _post(api, people, first, "supplement", "please hurry")
    assert response.status_code == 200 and response.json()["id"] == first.pk
    assert Run.objects.filter(session=first.session).count() == 1
    assert first.messages.filter(role="user", content="please hurry").exists()
    assert first.events.filter(type="input", reason="supplemented", actor="user:requester").exists()


def test_interrupt_cancels_the_active_run_and_starts_a_new_one(people, worker, api):
    first = _busy_session(people, worker)
    response = _post(api, people, first, "interrupt", "never mind, new request")
    assert response.status_code == 201
    worker.drain()
    first.refresh_from_db()
    second = Run.objects.get(pk=response.json()["id"])
    assert first.status == RunStatus.CANCELLED
    assert first.events.filter(reason="interrupted by a new input").exists()
    assert second.status == RunStatus.WAITING
    assert transfers() == []


def test_reject_answers_409_naming_the_active_run(people, worker, api):
    first = _busy_session(people, worker)
    response = _post(api, people, first, "reject")
    error = error_of(response, 409)
    assert (error["code"], error["details"]["active_run"]) == ("session_busy", first.pk)
    assert Run.objects.filter(session=first.session).count() == 1


def test_unknown_strategy_is_a_400(people, worker, api):
    first = _busy_session(people, worker)
    assert _post(api, people, first, "shout").status_code == 400
