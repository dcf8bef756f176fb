"""GET /api/runs/{id}/wait/: an async long poll that answers once the run waits or ends, or at the timeout."""

import os
import time

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import AsyncClient
from rest_framework.authtoken.models import Token

from runs.models import Run
from tests.support.api import start_run
from tests.support.processes import database_url_for_subprocess, serving
from tests.support.waits import waiting_agent

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = {"name": "ask_user", "arguments": {"question": "Which account, A or B?", "options": ["A", "B"]}}


@pytest.fixture
def served(people, tmp_path):
    """Base URL of ``manage.py serve`` (Daphne) running against the test database, with this test's settings."""
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(), "MEDIA_ROOT": str(tmp_path / "media"),
           "PYTHONUNBUFFERED": "1"}
    with serving(env, tmp_path / "serve.log") as base:
        yield base


def _token(user) -> dict:
    """Request headers authenticating as ``user`` with an API token (none for None)."""
    if user is None:
        return {}
    token, _ = Token.objects.get_or_create(user=user)
    return {"Authorization": f"Token {token.key}"}


def _wait(headers: dict, run_id: int, query: str = "", client: AsyncClient | None = None) -> tuple[object, float]:
    """(response, seconds it took) of the wait request, through Django's ASGI request handling."""
    started = time.monotonic()
    response = async_to_sync((client or AsyncClient()).get)(f"/api/runs/{run_id}/wait/{query}", headers=headers)
    return response, time.monotonic() - started


def test_wait_returns_as_soon_as_the_run_waits(idle_worker, people, api):
    agent = waiting_agent(api(people["admin"]), "asks", QUESTION)
    run = start_run(api(people["requester"]), agent, "Move my savings.")
    idle_worker.worker.start()  # the run moves while the request waits

    response, took = _wait(_token(people["requester"]), run["id"], "?timeout=30")

    assert response.status_code == 200, response.content
    assert response["Wait-Timed-Out"] == "false"
    body = response.json()
    assert (body["id"], body["status"], body["waiting_reason"]) == (run["id"], "waiting", "input")
    assert body["waiting_for"]["kind"] == "input"
    assert took < 20  # well before the timeout
    assert Run.objects.get(pk=run["id"]).status == "waiting"


def test_wait_answers_at_the_timeout_with_the_run_as_it_is(idle_worker, people, api, asking):
    run = start_run(api(people["requester"]), asking)  # no worker consumes: it stays queued

    response, took = _wait(_token(people["requester"]), run["id"], "?timeout=1")

    assert response.status_code == 200
    assert response["Wait-Timed-Out"] == "true"
    assert response.json()["status"] == "queued"
    assert 1 <= took < 10


def test_wait_of_an_ended_run_answers_at_once(worker, people, api):
    agent = waiting_agent(api(people["admin"]), "quick", {"name": "wait_until", "arguments": {"until": "2020-01-01T00:00:00Z"}})
    run = start_run(api(people["requester"]), agent, "Go.")
    worker.drain()
    response, took = _wait(_token(people["requester"]), run["id"])
    assert (response.status_code, response["Wait-Timed-Out"], response.json()["status"]) == (200, "false", "completed")
    assert took < 5


def test_wait_needs_a_user_who_may_see_the_run_and_a_sane_timeout(people, api, asking):
    run = start_run(api(people["requester"]), asking)
    stranger = get_user_model().objects.create_user("stranger", password="a-long-and-unusual-passphrase-42")
    assert _wait({}, run["id"])[0].status_code == 401
    assert _wait({"Authorization": "Token not-a-token"}, run["id"])[0].status_code == 401
    assert _wait(_token(stranger), run["id"], "?timeout=1")[0].status_code == 404
    for query in ("?timeout=0", "?timeout=61", "?timeout=abc", "?timeout=-5"):
        response = _wait(_token(people["requester"]), run["id"], query)[0]
        assert response.status_code == 400, query
    post = async_to_sync(AsyncClient().post)(f"/api/runs/{run['id']}/wait/", headers=_token(people["requester"]))
    assert post.status_code == 405


def test_wait_works_with_a_session_login(people, api, asking):
    run = start_run(api(people["requester"]), asking)
    client = AsyncClient()
    client.force_login(people["requester"])
    response, _ = _wait({}, run["id"], "?timeout=1", client=client)
    assert (response.status_code, response["Wait-Timed-Out"]) == (200, "true")


def test_wait_over_real_http_from_daphne_with_a_token(served, worker, people, api):
    agent = waiting_agent(api(people["admin"]), "asks-over-http", QUESTION)
    headers = _token(people["requester"])
    created = httpx.post(f"{served}/api/runs/", json={"agent": agent, "input": "Move my savings."},
                         headers=headers, timeout=10)
    assert created.status_code == 201, created.text

    answer = httpx.get(f"{served}/api/runs/{created.json()['id']}/wait/?timeout=30", headers=headers, timeout=45)

    assert answer.status_code == 200, answer.text
    assert answer.headers["Wait-Timed-Out"] == "false"
    assert (answer.json()["status"], answer.json()["waiting_reason"]) == ("waiting", "input")
    assert httpx.get(f"{served}/api/runs/{created.json()['id']}/wait/?timeout=1", timeout=10).status_code == 401
