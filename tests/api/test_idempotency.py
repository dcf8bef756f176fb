"""Issue 11, item 2: ``Idempotency-Key`` on every mutating POST (``config.idempotency``).

Same key and body: the first answer again, marked ``Idempotent-Replayed``,
nothing done twice; another body: 422; keys per user and per endpoint;
concurrent sends decided once by the unique row; errors release the key;
keys expire after 24 hours. That every POST endpoint has the mixin is
tests/unit/test_idempotency_coverage.py.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Interrupt
from runs.models import IdempotentRequest, Run, RunEvent, Session
from tests.support.api import all_at_once, error_of, field_errors, start_run
from tests.support.fake_tools import transfers
from tests.support.security import core_approval_item  # noqa: F401

KEY = {"Idempotency-Key": "decide-7f3a"}


def _approve(client, item, body=None, headers=KEY):
    return client.post(f"/api/interrupts/{item.pk}/approve/", body or {"comment": "ok"}, format="json",
                       headers=headers)


def test_an_approval_sent_twice_is_decided_once_and_answered_the_same(people, api, core_approval_item, worker):
    approver = api(people["approver"])
    first = _approve(approver, core_approval_item)
    worker.drain()
    decided = Interrupt.objects.get(pk=core_approval_item.pk)
    events = RunEvent.objects.count()

    again = _approve(approver, core_approval_item)

    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Interrupt.objects.get(pk=core_approval_item.pk).resolved_at == decided.resolved_at
    assert RunEvent.objects.count() == events
    assert len(transfers()) == 1
    without_key = approver.post(f"/api/interrupts/{core_approval_item.pk}/approve/", {"comment": "ok"}, format="json")
    assert error_of(without_key, 409)["code"] == "illegal_transition", "without the key it is a new request"


def test_the_same_key_with_another_body_is_422_and_does_nothing(people, api, core_approval_item, asking):
    approver = api(people["approver"])
    session = api(people["requester"]).post("/api/sessions/", {"agent": asking}, format="json",
                                            headers=KEY)
    assert session.status_code == 201

    other = api(people["requester"]).post("/api/sessions/", {"agent": asking, "title": "another"},
                                          format="json", headers=KEY)

    assert error_of(other, 422)["code"] == "idempotency_key_reused"
    assert Session.objects.filter(title="another").count() == 0
    # A key is per endpoint: the approver may use it elsewhere, and the requester's use is not theirs.
    assert _approve(approver, core_approval_item).status_code == 200


def test_keys_are_per_user(people, api, asking):
    body = {"agent": asking, "title": "weekly"}
    mine = api(people["requester"]).post("/api/sessions/", body, format="json", headers=KEY)
    theirs = api(people["approver"]).post("/api/sessions/", body, format="json", headers=KEY)

    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]
    assert "Idempotent-Replayed" not in theirs


def test_a_key_names_one_request_per_endpoint_so_another_object_is_another_request(people, api, asking):
    requester = api(people["requester"])
    runs = [start_run(requester, asking, f"Send {n} to acme.") for n in range(2)]

    first = requester.post(f"/api/runs/{runs[0]['id']}/cancel/", format="json", headers=KEY)
    second = requester.post(f"/api/runs/{runs[1]['id']}/cancel/", format="json", headers=KEY)

    assert first.status_code == 200
    assert error_of(second, 422)["code"] == "idempotency_key_reused"
    assert [Run.objects.get(pk=r["id"]).status for r in runs] == ["cancelled", "queued"]


def test_starting_a_run_replays_the_stored_answer(people, api, asking):
    requester = api(people["requester"])
    body = {"agent": asking, "input": "Send 80 to acme."}
    first = requester.post("/api/runs/", body, format="json", headers=KEY)

    again = requester.post("/api/runs/", body, format="json", headers=KEY)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1


def test_a_run_key_outlives_the_stored_answer_through_the_run_itself(people, api, asking):
    requester = api(people["requester"])
    body = {"agent": asking, "input": "Send 80 to acme."}
    first = requester.post("/api/runs/", body, format="json", headers=KEY)
    IdempotentRequest.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    again = requester.post("/api/runs/", body, format="json", headers=KEY)

    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1


def test_an_expired_key_is_a_new_key(people, api, asking):
    requester = api(people["requester"])
    assert requester.post("/api/sessions/", {"agent": asking}, format="json", headers=KEY).status_code == 201
    record = IdempotentRequest.objects.get()
    assert timedelta(hours=23, minutes=59) < record.expires_at - record.started_at <= timedelta(hours=24)
    IdempotentRequest.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    later = requester.post("/api/sessions/", {"agent": asking, "title": "later"}, format="json", headers=KEY)

    assert later.status_code == 201 and "Idempotent-Replayed" not in later
    assert Session.objects.count() == 2 and IdempotentRequest.objects.count() == 1


def test_an_error_releases_the_key_so_the_corrected_request_goes_through(people, api, asking):
    requester = api(people["requester"])
    bad = requester.post("/api/sessions/", {"agent": asking, "metadata": [1]}, format="json", headers=KEY)
    assert "metadata" in field_errors(bad)
    assert not IdempotentRequest.objects.exists()

    good = requester.post("/api/sessions/", {"agent": asking, "metadata": {"ticket": 1}}, format="json",
                          headers=KEY)

    assert good.status_code == 201 and good.json()["metadata"] == {"ticket": 1}


def test_a_request_still_being_handled_holds_its_key(people, api, asking):
    requester = api(people["requester"])
    body = {"agent": asking}
    assert requester.post("/api/sessions/", body, format="json", headers=KEY).status_code == 201
    IdempotentRequest.objects.update(response_status=None, response_body=None)  # as if still in flight

    busy = requester.post("/api/sessions/", body, format="json", headers=KEY)

    assert error_of(busy, 409)["code"] == "idempotency_key_in_use"
    assert Session.objects.count() == 1
    # A holder that died (no answer after 5 minutes) is taken over by the next send.
    IdempotentRequest.objects.update(started_at=timezone.now() - timedelta(minutes=6))
    taken_over = requester.post("/api/sessions/", body, format="json", headers=KEY)
    assert taken_over.status_code == 201 and Session.objects.count() == 2
    assert requester.post("/api/sessions/", body, format="json", headers=KEY)["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize("key", ["", "k" * 201, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_bad_request(people, api, key, asking):
    response = api(people["requester"]).post("/api/sessions/", {"agent": asking}, format="json",
                                             HTTP_IDEMPOTENCY_KEY=key)

    assert "Idempotency-Key" in field_errors(response)
    assert not Session.objects.exists()


def test_concurrent_sends_with_one_key_are_carried_out_once(people, api, core_approval_item, worker):
    clients = [api(people["approver"]) for _ in range(4)]
    answers = all_at_once(len(clients), lambda n: _approve(clients[n], core_approval_item))
    worker.drain()

    carried_out = [a for a in answers if a.status_code == 200 and "Idempotent-Replayed" not in a]
    assert len(carried_out) == 1
    for answer in answers:
        if answer.status_code == 200:
            assert answer.json() == carried_out[0].json()
        else:
            assert error_of(answer, 409)["code"] == "idempotency_key_in_use", "never decided a second time"
    assert len(transfers()) == 1
