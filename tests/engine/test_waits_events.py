"""wait_for_event: a run waits ``external_event`` until POST /api/events/ brings its type and key."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from runs.models import Run, RunEvent
from tests.support.api import events, get_run, start_run, tool_calls
from tests.support.waits import sweep_later, tool_result, waiting_agent
from tools.models import ExternalEvent, Wait

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "K-order-123-settlement"


def _wait_call(timeout_s: int = 3600, key: str | None = KEY) -> dict:
    arguments = {"event_type": "payment.settled", "timeout_s": timeout_s}
    if key:
        arguments["correlation_key"] = key
    return {"name": "wait_for_event", "arguments": arguments}


@pytest.fixture
def gateway_bot(api):
    """The outside system: a service user with a token, allowed to deliver events (``tools.add_externalevent``)."""
    bot = get_user_model().objects.create_user("gateway-bot", password="a-long-and-unusual-passphrase-42")
    bot.user_permissions.add(Permission.objects.get(codename="add_externalevent", content_type__app_label="tools"))
    return api(bot)


def test_only_the_runs_requester_or_a_permitted_sender_may_deliver_its_event(worker, people, api, gateway_bot):
    run = _waiting_run(worker, people, api, _wait_call())
    stranger = api(get_user_model().objects.create_user("stranger", password="another-long-passphrase-77"))
    body = {"type": "payment.settled", "key": KEY, "payload": {"amount": "80.00"}}

    refused = stranger.post("/api/events/", body, format="json")
    assert refused.status_code == 404  # as for a key nobody waits on: nothing says the run exists
    assert Run.objects.get(pk=run["id"]).status == "waiting" and not ExternalEvent.objects.exists()

    assert api(people["requester"]).post("/api/events/", body, format="json").status_code == 201
    # Delivered now: a stranger repeating it learns nothing (not even the run), the permitted sender is told.
    assert stranger.post("/api/events/", body, format="json").status_code == 404
    again = gateway_bot.post("/api/events/", body, format="json")
    assert again.status_code == 200 and (again.json()["duplicate"], again.json()["run"]) == (True, run["id"])


def _waiting_run(worker, people, api, call: dict) -> dict:
    agent = waiting_agent(api(people["admin"]), "waits-for-payment", call, final="Payment settled.")
    requester = api(people["requester"])
    run = start_run(requester, agent, "Ship once paid.")
    worker.drain()
    run = get_run(requester, run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "external_event")
    return run


def test_event_with_the_key_resumes_the_run_once_and_a_repeat_changes_nothing(worker, people, api, gateway_bot):
    run = _waiting_run(worker, people, api, _wait_call())
    assert run["waiting_for"]["event_type"] == "payment.settled"
    assert run["waiting_for"]["correlation_key"] == KEY
    body = {"type": "payment.settled", "key": KEY, "payload": {"amount": "80.00", "currency": "EUR"}}

    first = gateway_bot.post("/api/events/", body, format="json")
    assert first.status_code == 201, first.json()
    assert (first.json()["run"], first.json()["duplicate"]) == (run["id"], False)
    worker.drain()

    finished = get_run(api(people["requester"]), run["id"])
    assert (finished["status"], finished["outcome"]) == ("completed", "achieved")
    assert tool_result(run["id"], "wait_for_event") == {"status": "succeeded", "result": {
        "event_type": "payment.settled", "correlation_key": KEY, "payload": {"amount": "80.00", "currency": "EUR"}}}
    timeline = events(api(people["requester"]), run["id"])
    received, = [e for e in timeline if e["type"] == "external_event"]
    assert received["reason"] == "payment.settled received" and received["actor"] == "user:gateway-bot"
    assert [e["to_status"] for e in timeline if e["type"] == "transition"][-2:] == ["running", "completed"]

    seen = (RunEvent.objects.count(), Run.objects.get(pk=run["id"]).updated_at)
    second = gateway_bot.post("/api/events/", {**body, "payload": {"amount": "1.00"}}, format="json")
    assert second.status_code == 200
    assert (second.json()["id"], second.json()["duplicate"]) == (first.json()["id"], True)
    assert ExternalEvent.objects.get().payload == body["payload"]
    assert (RunEvent.objects.count(), Run.objects.get(pk=run["id"]).updated_at) == seen


def test_a_wrong_key_or_type_resumes_nothing(worker, people, api, gateway_bot):
    run = _waiting_run(worker, people, api, _wait_call())
    for body in ({"type": "payment.settled", "key": KEY + "x"}, {"type": "payment.failed", "key": KEY}):
        answer = gateway_bot.post("/api/events/", body, format="json")
        assert answer.status_code == 404, answer.json()
    assert ExternalEvent.objects.count() == 0
    assert Run.objects.get(pk=run["id"]).status == "waiting"
    assert APIClient().post("/api/events/", {"type": "payment.settled", "key": KEY},
                            format="json").status_code == 401
    assert Run.objects.get(pk=run["id"]).status == "waiting"


def test_bad_events_are_refused_before_anything_is_stored(worker, people, api, gateway_bot, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_EVENT_PAYLOAD_BYTES": 100}
    run = _waiting_run(worker, people, api, _wait_call())
    bad = [
        {"type": "payment settled!", "key": KEY},
        {"type": "payment.settled", "key": "has space"},
        {"type": "payment.settled", "key": KEY, "payload": {"note": "x" * 200}},
        {"type": "payment.settled", "key": KEY, "extra": 1},
    ]
    for body in bad:
        answer = gateway_bot.post("/api/events/", body, format="json")
        assert answer.status_code == 400, (body, answer.json())
    assert ExternalEvent.objects.count() == 0
    assert Run.objects.get(pk=run["id"]).status == "waiting"


def test_a_generated_key_is_shown_on_the_run_and_works(worker, people, api, gateway_bot):
    run = _waiting_run(worker, people, api, _wait_call(key=None))
    key = run["waiting_for"]["correlation_key"]
    assert len(key) == 32 and key == Wait.objects.get(run_id=run["id"]).correlation_key
    assert gateway_bot.post("/api/events/", {"type": "payment.settled", "key": key},
                            format="json").status_code == 201
    worker.drain()
    assert tool_result(run["id"], "wait_for_event")["result"]["payload"] == {}


def test_no_event_by_the_timeout_fails_the_call_and_the_run_goes_on(worker, people, api, gateway_bot):
    run = _waiting_run(worker, people, api, _wait_call(timeout_s=60))
    assert sweep_later(30)["woken"] == 0
    assert sweep_later(90)["woken"] == 1
    worker.drain()

    requester = api(people["requester"])
    call, = tool_calls(requester, run["id"])
    assert call["status"] == "failed"
    assert call["error"] == "Timed out: no payment.settled event came within the wait's timeout."
    finished = get_run(requester, run["id"])
    assert (finished["status"], finished["outcome"], finished["model_calls"]) == ("completed", "not_achieved", 2)
    late = gateway_bot.post("/api/events/", {"type": "payment.settled", "key": KEY}, format="json")
    assert late.status_code == 404


def test_a_key_held_by_a_waiting_run_is_refused_to_another_wait(worker, people, api):
    _waiting_run(worker, people, api, _wait_call())
    other = waiting_agent(api(people["admin"]), "waits-too", _wait_call())
    run = start_run(api(people["requester"]), other, "Me too.")
    worker.drain()
    call, = tool_calls(api(people["requester"]), run["id"])
    assert call["status"] == "denied"
    assert "already used" in call["error"]
    assert Wait.objects.filter(status="pending").count() == 1


def test_waits_are_bounded_by_max_wait(worker, people, api, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_WAIT_S": 600}
    agent = waiting_agent(api(people["admin"]), "waits-long", _wait_call(timeout_s=601))
    run = start_run(api(people["requester"]), agent, "Wait long.")
    worker.drain()
    call, = tool_calls(api(people["requester"]), run["id"])
    assert (call["status"], call["error"]) == ("denied", "timeout_s is 601; the longest wait allowed is 600 seconds.")
    assert not Wait.objects.exists()
