"""POST /api/runs/{id}/retry/ under attack: a run is retried once, however many requests arrive at once.

Found by attacking the API: retrying the same cancelled run several times
(a double click, or requests sent at once without an ``Idempotency-Key``)
made one new run per request, each reading and calling the model again.
Now the second retry is a 409 naming the first (retry that one instead);
the same request again with its ``Idempotency-Key`` still answers with the
run it made.
"""

import pytest

from runs.models import Run
from tests.support.api import all_at_once, error_of, get_run, start_run
from tests.support.waits import waiting_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cancelled_run(people, api, worker) -> dict:
    """A run of the requester that asked a question and was then cancelled."""
    call = {"name": "ask_user", "arguments": {"question": "Which account?", "options": ["A", "B"]}}
    agent = waiting_agent(api(people["admin"]), "attack-asks", call)
    requester = api(people["requester"])
    run = start_run(requester, agent, "Move my savings.")
    worker.drain()
    assert requester.post(f"/api/runs/{run['id']}/cancel/", {}, format="json").status_code == 200
    assert get_run(requester, run["id"])["status"] == "cancelled"
    return run


def test_a_run_is_retried_once_and_a_second_retry_names_the_first(people, api, cancelled_run):
    requester = api(people["requester"])
    url = f"/api/runs/{cancelled_run['id']}/retry/"

    first = requester.post(url, {}, format="json")
    assert first.status_code == 201, first.json()
    second = requester.post(url, {}, format="json", headers={"Idempotency-Key": "another-request"})

    error = error_of(second, 409)
    assert error["details"] == {"status": "cancelled", "retry": first.json()["id"]}
    assert Run.objects.filter(retry_of_id=cancelled_run["id"]).count() == 1


def test_retries_sent_at_once_without_a_key_make_one_run(people, api, cancelled_run):
    clients = [api(people["requester"]) for _ in range(6)]
    url = f"/api/runs/{cancelled_run['id']}/retry/"

    answers = all_at_once(len(clients), lambda n: clients[n].post(url, {}, format="json"))

    made = [a for a in answers if a.status_code == 201]
    assert len(made) == 1, [(a.status_code, a.content[:200]) for a in answers]
    for answer in answers:
        if answer is not made[0]:
            assert error_of(answer, 409)["details"]["retry"] == made[0].json()["id"]
    assert list(Run.objects.filter(retry_of_id=cancelled_run["id"]).values_list("pk", flat=True)) == [
        made[0].json()["id"]]


def test_the_same_retry_with_its_key_still_answers_with_its_run_once_stored_answers_are_gone(people, api,
                                                                                             cancelled_run):
    from runs.models import IdempotentRequest

    requester = api(people["requester"])
    url = f"/api/runs/{cancelled_run['id']}/retry/"
    first = requester.post(url, {}, format="json", headers={"Idempotency-Key": "retry-1"})
    assert first.status_code == 201
    IdempotentRequest.objects.all().delete()  # as if the 24 hours had passed

    again = requester.post(url, {}, format="json", headers={"Idempotency-Key": "retry-1"})

    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"


def test_a_retry_of_the_retry_is_allowed_once_it_ended(people, api, worker, cancelled_run):
    requester = api(people["requester"])
    retry = requester.post(f"/api/runs/{cancelled_run['id']}/retry/", {}, format="json").json()
    worker.drain()
    assert requester.post(f"/api/runs/{retry['id']}/cancel/", {}, format="json").status_code == 200

    again = requester.post(f"/api/runs/{retry['id']}/retry/", {}, format="json")

    assert again.status_code == 201 and Run.objects.get(pk=again.json()["id"]).retry_of_id == retry["id"]
