"""docs/integrating.md, proven: its example app (``examples/bookings``) run as an integrator runs it.

* (That every code block of the guide marked as coming from a file is that file's code is
  tests/unit/test_integrating_guide_quotes.py.)
* Tollgate's own settings (``config.settings``) with ``TOLLGATE_EXTRA_APPS=examples.bookings`` in the
  environment of a real ``manage.py serve`` process (plus a ``manage.py rundramatiq`` worker process where
  ``REDIS_URL`` is set: ``serve`` then only serves), on the test database; the test talks plain HTTP with
  API tokens. The model is a strict OpenAI-compatible server over real HTTP
  (``tests/support/fakes/strict_openai.py``: it refuses what the real API refuses). One run uses the app's sync and
  async tools, waits for an approval that is decided over the REST API with edited arguments, and
  completes; a second meets a model 400 whose message reads back from ``GET /api/runs/{id}/`` and its
  steps. Webhooks for both reach a receiver and verify with ``standardwebhooks``.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.authtoken.models import Token
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from examples.bookings import backend
from tests.support.processes import database_url_for_subprocess, serving_process
from tests.support.fakes.strict_openai import StrictOpenAIServer

ROOT = Path(__file__).resolve().parents[2]


# --- the example app, served -----------------------------------------------------

AGENT = {
    "slug": "travel-desk", "name": "Travel desk",
    "instructions": "You book flights for our customers. Use the tools; never invent a booking reference.",
    "model": {"provider": "openai", "endpoint": "travel-llm", "model": "gpt-4o-mini"},
    "tools": ["find_flights", "book_flight", "order_catering"],
    "completion_check": "trip_booked",
    "max_model_calls": 10,
    "deadline_s": 600,
}
SEARCH = {"origin": "BKK", "destination": "NRT", "date": "2027-03-14"}
BOOKING = {"flight": "TG640", "passenger": "Mali Srisuk"}
CATERING = {"booking_ref": "BK00001", "meals": 3, "amount": 300}
EDITED = {"booking_ref": "BK00001", "meals": 2, "amount": 180}
TRIP = [
    {"tool_calls": [{"name": "find_flights", "arguments": json.dumps(SEARCH)}]},
    {"tool_calls": [{"name": "book_flight", "arguments": json.dumps(BOOKING)}]},
    {"tool_calls": [{"name": "order_catering", "arguments": json.dumps(CATERING)}]},
    {"content": "Mali Srisuk is booked on TG640 (BK00001), with meals."},
]
TOO_LONG = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9120 tokens."


def _until(predicate, what: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _settled(client: httpx.Client, run_id: int, statuses: set[str]) -> dict:
    """The run once its status is one of ``statuses``, waited for as an integrator would: ``GET .../wait/``."""
    def look():
        run = client.get(f"/api/runs/{run_id}/wait/", params={"timeout": 5}).json()
        return run if run["status"] in statuses else None

    return _until(look, f"run {run_id} to be {statuses}")


@pytest.fixture
def llm():
    with StrictOpenAIServer([]) as server:
        yield server


@pytest.fixture
def integrator(transactional_db, llm, tmp_path):
    """``(base URL, {username: token})`` of Tollgate served with the bookings app added by the environment."""
    User = get_user_model()
    users = {"requester": User.objects.create_user("requester"), "approver": User.objects.create_user("approver"),
             "admin": User.objects.create_superuser("admin")}
    users["approver"].user_permissions.add(Permission.objects.get(codename="decide_interrupt"))
    tokens = {name: Token.objects.create(user=user).key for name, user in users.items()}

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "PYTHONUNBUFFERED": "1",
           "TOLLGATE_EXTRA_APPS": "examples.bookings", "DATABASE_URL": database_url_for_subprocess(),
           "BOOKINGS_LEDGER": str(tmp_path / "bookings-ledger.sqlite3"), "MEDIA_ROOT": str(tmp_path / "media"),
           "TOLLGATE_MODEL_ENDPOINTS": json.dumps({"travel-llm": {"provider": "openai", "base_url": llm.base_url}}),
           "TOLLGATE_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "TOLLGATE_WEBHOOK_ALLOW_HTTP": "true"}
    workers = []
    if env.get("REDIS_URL"):  # the production shape: serve only serves; a worker process runs the runs
        dramatiq.get_broker().flush_all()
        log = open(tmp_path / "worker.log", "wb")
        workers.append(subprocess.Popen([sys.executable, "manage.py", "rundramatiq", "--processes", "1",
                                         "--threads", "2", "--skip-logging"],
                                        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        with serving_process(env, tmp_path / "serve.log") as (base, _):
            yield base, tokens
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(20)
        if os.environ.get("TOLLGATE_SHOW_SERVE_LOG"):
            print((tmp_path / "serve.log").read_text())


def test_the_guides_bookings_app_runs_with_a_strict_model_server_approvals_and_webhooks(
        integrator, llm, receiver, tmp_path, monkeypatch):
    base, tokens = integrator
    admin, requester, approver = (httpx.Client(base_url=base, timeout=30, headers={
        "Authorization": f"Token {tokens[name]}"}) for name in ("admin", "requester", "approver"))

    tools = {tool["name"] for tool in requester.get("/api/tools/").json()["results"]}
    assert {"find_flights", "book_flight", "order_catering"} <= tools
    created = admin.post("/api/agents/", json=AGENT)
    assert created.status_code == 201, created.text
    subscribed = requester.post("/api/webhooks/", json={
        "url": receiver.url, "event_types": ["interrupt.created", "run.completed", "run.failed"]})
    assert subscribed.status_code == 201, subscribed.text
    secret = subscribed.json()["secret"]

    # A trip: sync search, async booking, catering over 200 waits for a person.
    llm.script.extend(TRIP)
    started = requester.post("/api/runs/", json={
        "agent": "travel-desk", "input": "Book Mali Srisuk on the cheapest BKK-NRT flight on 14 March 2027, "
                                         "with meals for three."})
    assert started.status_code == 201, started.text
    trip = started.json()["id"]
    waiting = _settled(requester, trip, {"waiting", "completed", "failed", "cancelled"})
    assert (waiting["status"], waiting["waiting_reason"]) == ("waiting", "approval"), waiting

    item, = approver.get("/api/interrupts/", params={"run": trip, "status": "pending"}).json()["results"]
    assert item["proposed_arguments"] == CATERING and item["can_decide"] is True
    assert requester.post(f"/api/interrupts/{item['id']}/approve/", json={"comment": "mine"}).status_code == 403
    approved = approver.post(f"/api/interrupts/{item['id']}/approve/",
                             json={"comment": "Two meals are enough.", "arguments": EDITED})
    assert approved.status_code == 200, approved.text
    assert approved.json()["decision"] == "approved"

    run = _settled(requester, trip, {"completed", "failed", "cancelled"})
    assert (run["status"], run["outcome"]) == ("completed", "achieved"), run
    assert run["final_output"] == TRIP[-1]["content"]
    decision, = run["decisions"]
    assert (decision["decided_by"], decision["comment"]) == ("approver", "Two meals are enough.")
    assert {(change["field"], change["proposed"], change["approved"]) for change in decision["changes"]} == {
        ("meals", 3, 2), ("amount", 300, 180)}
    assert [conflict["code"] for conflict in run["final_output_status"]["conflicts"]] == ["arguments_edited"]

    calls = requester.get(f"/api/runs/{trip}/tool-calls/").json()["results"]
    assert [(call["name"], call["status"]) for call in calls] == [
        ("find_flights", "succeeded"), ("book_flight", "succeeded"), ("order_catering", "succeeded")]
    search, booking, catering = calls
    assert [flight["flight"] for flight in search["result"]["flights"]] == ["TG640", "TG642"]
    assert booking["result"]["ref"] == "BK00001" and booking["idempotency_key"].startswith("book_flight-")
    assert catering["arguments"] == EDITED and json.loads(catering["raw_arguments"]) == CATERING
    assert (catering["result"]["meals"], catering["result"]["amount"]) == (2, 180)
    monkeypatch.setenv("BOOKINGS_LEDGER", str(tmp_path / "bookings-ledger.sqlite3"))
    assert backend.by_key(booking["idempotency_key"]) == booking["result"]  # the key reached the backend
    assert backend.by_ref("ML00002")["amount"] == 180  # the approved amount, not the proposed one

    # What went over the wire: four valid requests, tools and results in the OpenAI shape.
    assert llm.violations == []
    bodies = llm.bodies()
    assert len(bodies) == 4
    assert [tool["function"]["name"] for tool in bodies[0]["tools"]] == AGENT["tools"]
    assert bodies[0]["messages"][0] == {"role": "system", "content": AGENT["instructions"]}
    assert bodies[0]["model"] == "gpt-4o-mini" and bodies[0]["stream"] is True
    last = bodies[-1]["messages"]
    assert [message["role"] for message in last] == ["system", "user"] + ["assistant", "tool"] * 3
    told = json.loads(last[-1]["content"])  # the model reads the result and the approver's edit
    assert (told["status"], told["result"]["amount"]) == ("succeeded", 180)
    assert told["approval"]["approved_arguments"] == EDITED

    # The model server refuses the next request: the run fails and says what the server said.
    llm.script.append({"status": 400, "message": TOO_LONG})
    refused = requester.post("/api/runs/", json={"agent": "travel-desk", "input": "And one to London."}).json()
    failed = _settled(requester, refused["id"], {"completed", "failed", "cancelled"})
    assert (failed["status"], failed["failure_type"]) == ("failed", "model_error"), failed
    assert failed["error"] == f"OpenAI API error 400 (BadRequestError): {TOO_LONG}"
    step, = requester.get(f"/api/runs/{refused['id']}/steps/").json()["results"]
    assert step["status"] == "failed" and step["error"] == failed["error"]
    assert step["server_error"] == {"status": 400, "message": TOO_LONG}

    # The webhooks: signed with the subscription's secret, verified by the reference library.
    received = receiver.wait_for(3)
    payloads = [Webhook(secret).verify(request["body"], request["headers"]) for request in received]
    assert [(payload["type"], payload["data"]["run"]) for payload in payloads] == [
        ("interrupt.created", trip), ("run.completed", trip), ("run.failed", refused["id"])]
    assert payloads[0]["data"]["tool"] == "order_catering"
    assert payloads[1]["data"]["outcome"] == "achieved"
    assert payloads[2]["data"]["error"] == failed["error"]
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(received[2]["body"].replace(b"model_error", b"model_errors"), received[2]["headers"])
