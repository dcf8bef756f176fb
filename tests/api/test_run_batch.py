"""``POST /api/runs/batch/``: many runs started by one request (``runs.engine.lifecycle.start_runs``), all or none,
each run counted against the ``runs`` throttle rate."""

import json
from datetime import timedelta

import pytest
from django.db.models.signals import post_save
from django.utils import timezone
from rest_framework.throttling import SimpleRateThrottle

from runs.models import Run, RunEvent, Session
from tests.support.api import error_of, field_errors

BATCH = "/api/runs/batch/"


def _batch(client, agent: str, inputs: list, **body):
    return client.post(BATCH, {"agent": agent, "inputs": inputs, **body}, format="json")


def test_a_batch_starts_a_run_per_input_each_in_a_session_of_its_own_and_they_run(people, api, refused,
                                                                                  idle_worker):
    requester = api(people["requester"])
    inputs = ["Send 500 to acme.", "  Send 500 to globex.  ", "Send 500 to initech."]
    announced = []

    def heard(sender, instance, created, **kwargs):
        announced.append((instance.run_id, instance.seq, created))

    post_save.connect(heard, sender=RunEvent, weak=False)
    try:
        response = _batch(requester, refused, inputs)
    finally:
        post_save.disconnect(heard, sender=RunEvent)

    assert response.status_code == 201, response.json()
    runs = response.json()
    assert [run["input"] for run in runs] == [text.strip() for text in inputs]
    assert {run["status"] for run in runs} == {"queued"} and {run["agent"] for run in runs} == {refused}
    assert len({run["session"] for run in runs}) == 3
    assert Session.objects.filter(owner=people["requester"]).count() == 3
    for run in runs:
        assert [(e["seq"], e["type"], e["reason"], e["to_status"]) for e in
                requester.get(f"/api/runs/{run['id']}/events/").json()["results"]] == [
            (1, "transition", "created", "queued")]
    assert announced == [(run["id"], 1, True) for run in runs]  # as save() announces (the webhook outbox listens)

    idle_worker.worker.start()  # woken by the batch: each run is picked up and ends
    idle_worker.drain()

    ended = {run.pk: (run.status, run.outcome) for run in Run.objects.all()}
    assert ended == {run["id"]: ("completed", "not_achieved") for run in runs}
    assert [e.seq for e in RunEvent.objects.filter(run_id=runs[0]["id"]).order_by("seq")] == list(
        range(1, Run.objects.get(pk=runs[0]["id"]).last_event_seq + 1))  # the counter went on from the batch's 1


@pytest.mark.parametrize("inputs, field", [
    ([], "inputs"),
    (["Send 500 to acme.", "   "], "inputs"),
    ("Send 500 to acme.", "inputs"),
    (["x" * 20_001], "inputs"),
    (["Send it."] * 4, "inputs"),
])
def test_a_bad_batch_is_400_and_starts_nothing(people, api, refused, settings, inputs, field):
    settings.TOLLGATE = {**settings.TOLLGATE, "RUN_BATCH_MAX": 3}

    errors = field_errors(_batch(api(people["requester"]), refused, inputs))

    assert field in errors, errors
    assert not Run.objects.exists() and not Session.objects.exists()


def test_an_unknown_field_or_agent_or_a_start_too_far_ahead_is_400(people, api, refused):
    requester = api(people["requester"])
    too_far = (timezone.now() + timedelta(days=30)).isoformat()

    assert "session" in field_errors(_batch(requester, refused, ["Send it."], session=1))
    assert "agent" in field_errors(_batch(requester, "no-such-agent", ["Send it."]))
    assert "start_at" in field_errors(_batch(requester, refused, ["Send it."], start_at=too_far))
    assert not Run.objects.exists()


def test_each_run_of_a_batch_counts_against_the_runs_rate_all_or_none(people, api, refused, monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES, "runs": "5/min"})
    requester = api(people["requester"])

    first = _batch(requester, refused, ["One.", "Two.", "Three."])
    over = _batch(requester, refused, ["Four.", "Five.", "Six."])  # 2 left in the window
    never = _batch(requester, refused, ["Run."] * 6)  # over the whole rate

    assert first.status_code == 201
    throttled = error_of(over, 429)
    assert throttled["code"] == "throttled" and 0 < throttled["details"]["retry_after"] <= 60
    assert 0 < int(over["Retry-After"]) <= 60
    assert error_of(never, 400)["message"] == "At most 5 runs can be started at once (the runs rate)."
    assert Run.objects.count() == 3
    # The two left are there for single starts, and then no more.
    assert [requester.post("/api/runs/", {"agent": refused, "input": "Send it."}, format="json").status_code
            for _ in range(3)] == [201, 201, 429]
    assert error_of(_batch(requester, refused, ["Seven."]), 429)["code"] == "throttled"
    assert Run.objects.count() == 5


def test_a_scheduled_batch_waits_for_its_time_and_an_archived_agent_takes_none(people, api, refused, worker):
    requester = api(people["requester"])
    later = timezone.now() + timedelta(hours=1)

    runs = _batch(requester, refused, ["Send 500 to acme.", "Send 500 to globex."], start_at=later.isoformat()).json()
    worker.drain()

    assert [(r.status, r.waiting_reason, r.wake_at) for r in Run.objects.order_by("pk")] == [
        ("queued", "scheduled", later)] * 2
    assert [r["id"] for r in runs] == list(Run.objects.order_by("pk").values_list("pk", flat=True))
    assert api(people["admin"]).delete(f"/api/agents/{refused}/").status_code == 204
    archived = error_of(_batch(requester, refused, ["Send it."]), 409)
    assert archived["code"] == "agent_archived"
    assert Run.objects.count() == 2


def test_a_batch_sent_again_with_its_idempotency_key_answers_the_same_runs(people, api, refused, outsider):
    requester = api(people["requester"])
    key = {"Idempotency-Key": "batch-1"}

    first = requester.post(BATCH, {"agent": refused, "inputs": ["One.", "Two."]}, format="json", headers=key)
    again = requester.post(BATCH, {"agent": refused, "inputs": ["One.", "Two."]}, format="json", headers=key)
    other = requester.post(BATCH, {"agent": refused, "inputs": ["Three."]}, format="json", headers=key)

    assert (first.status_code, again.status_code) == (201, 201) and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert error_of(other, 422)["code"] == "idempotency_key_reused"
    assert Run.objects.count() == 2
    # They are the requester's: another user without the decide permission sees neither runs nor sessions.
    assert error_of(api(outsider).get(f"/api/runs/{first.json()[0]['id']}/"), 404)
    assert error_of(api(outsider).get(f"/api/sessions/{first.json()[0]['session']}/"), 404)


def test_a_batch_refused_for_bad_input_spends_none_of_the_runs_rate(people, api, refused, monkeypatch):
    """A batch refused for an input too long starts nothing, so it does not count: the corrected batch sent
    right after passes."""
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES, "runs": "5/min"})
    requester = api(people["requester"])

    bad = _batch(requester, refused, ["Send 500 to acme.", "x" * 20_001, "Send 500 to initech."])
    assert field_errors(bad)["inputs"] == {"1": ["Ensure this field has no more than 20000 characters."]}
    assert not Run.objects.exists()

    corrected = _batch(requester, refused, ["Send 500 to acme.", "Send 500 to globex.", "Send 500 to initech."])

    assert corrected.status_code == 201, corrected.json()


def test_the_schema_says_the_batch_answers_a_plain_list_of_runs_and_takes_no_query_parameters(people, api):
    """The view answers ``[run, ...]`` (201), unpaginated, and reads no filter or page parameter, and the
    schema says so (not the runs list's page, filters, cursor and page_size)."""
    schema = json.loads(api(people["requester"]).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
                        .content)

    operation = schema["paths"]["/api/runs/batch/"]["post"]
    created = operation["responses"]["201"]["content"]["application/json"]["schema"]
    assert created.get("type") == "array" and created["items"]["$ref"].endswith("/Run"), created
    assert [p["name"] for p in operation["parameters"] if p["in"] == "query"] == []


@pytest.mark.parametrize("start_at", [None, "past"])
def test_a_batched_runs_created_event_is_the_one_a_single_start_writes(people, api, refused, start_at):
    """The same request started alone (``POST /api/runs/``) and in a batch logs the same ``created`` event:
    seq, type, reason, actor, statuses and payload (a ``start_at`` already past included)."""
    requester = api(people["requester"])
    body = {"start_at": (timezone.now() - timedelta(minutes=5)).isoformat()} if start_at else {}

    alone = requester.post("/api/runs/", {"agent": refused, "input": "Send 500 to acme.", **body}, format="json")
    batched = _batch(requester, refused, ["Send 500 to acme.", "Send 500 to globex."], **body)
    assert (alone.status_code, batched.status_code) == (201, 201)

    def created(run_id):
        return RunEvent.objects.filter(run_id=run_id, seq=1).values(
            "seq", "type", "reason", "actor", "from_status", "to_status", "payload").get()

    assert created(batched.json()[0]["id"]) == created(alone.json()["id"])


def test_one_wake_up_the_broker_refuses_leaves_the_batchs_other_runs_woken(people, api, refused, idle_worker,
                                                                           monkeypatch):
    """A run of a batch whose wake-up the broker refuses (a blip) is the only one left to the sweeper, as when
    started alone: each wake-up is sent on its own."""
    import dramatiq
    from dramatiq.errors import BrokerConnectionError as BrokerDown

    from runs.sweeping import sweep

    broker = dramatiq.get_broker()
    enqueue, refusals = broker.enqueue, [BrokerDown("a blip")]

    def blipping(message, *, delay=None):
        if refusals:
            raise refusals.pop()
        return enqueue(message, delay=delay)

    monkeypatch.setattr(broker, "enqueue", blipping)
    response = _batch(api(people["requester"]), refused, ["One.", "Two.", "Three."])
    assert response.status_code == 201 and not refusals

    stranded = sweep(now=timezone.now() + timedelta(hours=1))["reenqueued"]

    assert stranded == 1, "only the run whose wake-up was refused should need the sweeper"


def test_start_runs_checks_every_input_itself_before_admitting_or_writing(people, refused):
    """The service is also called in-process (bench/latency.py): it refuses empty and oversized inputs itself,
    naming the input, and asks ``admit`` only once everything passed (the batch size is the API's limit)."""
    from runs.base.errors import InvalidInput
    from runs.engine.lifecycle import start_runs
    from runs.models import Agent

    agent, admitted = Agent.objects.get(slug=refused), []
    for inputs, field in ((["Send it.", "  "], "inputs[1]"), (["x" * 20_001], "inputs[0]"), ([], "inputs")):
        with pytest.raises(InvalidInput) as refusal:
            start_runs(agent=agent, user=people["requester"], inputs=inputs, admit=admitted.append)
        assert list(refusal.value.details) == [field]

    def full(count):
        raise InvalidInput("no room")

    with pytest.raises(InvalidInput, match="no room"):
        start_runs(agent=agent, user=people["requester"], inputs=["Send it."], admit=full)
    runs = start_runs(agent=agent, user=people["requester"], inputs=["One.", "Two."], admit=admitted.append)

    assert admitted == [2]
    assert list(Run.objects.order_by("pk")) == runs and Session.objects.count() == 2
