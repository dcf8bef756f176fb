"""wait_until and start_at: a run waits ``scheduled`` holding no worker; the sweeper wakes it."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.sweeping import sweep
from runs.models import Run
from tests.support.api import field_errors, get_run, start_run, tool_calls
from tests.support.core import asking_agent
from tests.support.waits import tool_result, waiting_agent, worker_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _sleep_until(moment) -> None:
    left = (moment - timezone.now()).total_seconds()
    if left > 0:
        time.sleep(left + 0.05)


def test_a_run_waits_two_seconds_without_a_worker_and_the_sweeper_resumes_it(worker, people, api):
    agent = waiting_agent(api(people["admin"]), "naps", {"name": "wait_until", "arguments": {"seconds": 2}},
                          final="Slept well.")
    requester = api(people["requester"])
    before = timezone.now()
    run = start_run(requester, agent, "Nap for two seconds.")
    worker.drain()

    waiting = Run.objects.get(pk=run["id"])
    assert (waiting.status, waiting.waiting_reason) == ("waiting", "scheduled")
    assert before + timedelta(seconds=2) <= waiting.wake_at <= timezone.now() + timedelta(seconds=2)
    # Nothing holds the run while it waits: no lease, no message in the broker, no actor at work.
    assert (waiting.lease_owner, waiting.lease_expires_at) == ("", None)
    assert worker_idle(worker)
    assert sweep()["woken"] == 0  # not due yet
    assert Run.objects.get(pk=run["id"]).status == "waiting"

    _sleep_until(waiting.wake_at)
    assert sweep()["woken"] == 1
    worker.drain()

    finished = get_run(requester, run["id"])
    assert (finished["status"], finished["outcome"]) == ("completed", "achieved")
    result = tool_result(run["id"], "wait_until")
    assert result["status"] == "succeeded"
    assert result["result"]["waited_until"] == waiting.wake_at.isoformat()
    assert result["result"]["woke_at"] >= result["result"]["waited_until"]


def test_wait_until_a_time_that_has_passed_goes_on_at_once(worker, people, api):
    agent = waiting_agent(api(people["admin"]), "no-nap",
                          {"name": "wait_until", "arguments": {"until": "2020-01-01T00:00:00+00:00"}})
    run = start_run(api(people["requester"]), agent, "Go.")
    worker.drain()
    assert Run.objects.get(pk=run["id"]).status == "completed"
    assert tool_result(run["id"], "wait_until")["result"]["waited_until"] == "2020-01-01T00:00:00+00:00"


@pytest.mark.parametrize("arguments, error", [
    ({"until": "tomorrow"}, "until must be an ISO 8601 date and time with a UTC offset"),
    ({"until": "2030-01-01T00:00:00"}, "until must be an ISO 8601 date and time with a UTC offset"),
    ({"seconds": 601}, "more than 600 seconds away"),
])
def test_wait_until_refuses_bad_or_too_distant_times(worker, people, api, settings, arguments, error):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_WAIT_S": 600}
    agent = waiting_agent(api(people["admin"]), "bad-nap", {"name": "wait_until", "arguments": arguments})
    run = start_run(api(people["requester"]), agent, "Nap.")
    worker.drain()
    call, = tool_calls(api(people["requester"]), run["id"])
    assert call["status"] == "denied" and error in call["error"]


def test_a_run_with_start_at_stays_queued_until_then(worker, people, api, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "QUEUED_GRACE_S": 0}  # the sweeper would re-send a lost queued run
    requester = api(people["requester"])
    start_at = timezone.now() + timedelta(seconds=60)  # far enough that a slow machine cannot reach it
    response = requester.post("/api/runs/", {"agent": asking_agent().slug, "input": "Send 80 to acme.",
                                             "start_at": start_at.isoformat()}, format="json")
    assert response.status_code == 201, response.json()
    run = response.json()
    assert (run["status"], run["waiting_reason"]) == ("queued", "scheduled")
    worker.drain()
    assert worker_idle(worker)
    assert sweep()["reenqueued"] == 0
    worker.drain()
    assert (Run.objects.get(pk=run["id"]).status, Run.objects.get(pk=run["id"]).started_at) == ("queued", None)

    start_at = timezone.now()  # the start time comes: the run's timer is brought forward rather than slept out
    # A grace again: else the pass's first job re-sends the run now due, and the worker may start it before the
    # same pass's start_scheduled_runs claims it.
    settings.TOLLGATE = {**settings.TOLLGATE, "QUEUED_GRACE_S": 60}
    Run.objects.filter(pk=run["id"]).update(wake_at=start_at)
    assert sweep()["started"] == 1
    worker.drain()
    started = get_run(requester, run["id"])
    assert (started["status"], started["waiting_reason"]) == ("waiting", "approval")  # the transfer asks an approver
    assert Run.objects.get(pk=run["id"]).started_at >= start_at


def test_start_at_is_checked(people, api, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_WAIT_S": 600}
    requester = api(people["requester"])
    body = {"agent": asking_agent().slug, "input": "Send 80 to acme."}
    too_far = requester.post("/api/runs/", {**body, "start_at": (timezone.now() + timedelta(seconds=700)).isoformat()},
                             format="json")
    assert "start_at" in field_errors(too_far)
    supplement = requester.post("/api/runs/", {**body, "multitask_strategy": "supplement",
                                               "start_at": (timezone.now() + timedelta(seconds=60)).isoformat()},
                                format="json")
    assert "start_at" in field_errors(supplement)
    garbage = requester.post("/api/runs/", {**body, "start_at": "soon"}, format="json")
    assert garbage.status_code == 400
    assert not Run.objects.exists()
    past = requester.post("/api/runs/", {**body, "start_at": "2020-01-01T00:00:00Z"}, format="json")
    assert (past.status_code, past.json()["waiting_reason"], past.json()["wake_at"]) == (201, "", None)
