"""Edges of untrusted input found by attacking a served instance (issue 26, "Smaller"): each a clear refusal.

* A model's tool arguments naming one key twice are an ``invalid`` call
  told to the model, as a body with one is a 400 (``test_attack_bodies``):
  which of the two values would have acted on the world was the parser's
  choice (the parser alone: tests/unit/test_model_arguments.py).
* ``wait_until`` with a moment UTC cannot hold (``0001-01-01T00:00:00+01:00``)
  raised ``OverflowError`` and failed the run ``internal_error``: now its
  precondition refuses it and the model is told.
* The history page with a day no filter can span (``day_to=9999-12-31``)
  answered 500: now 400 with the form's error, the first page shown.
"""

import pytest

from runs.models import Run
from tests.support.api import get_run, start_run
from tests.support.waits import tool_result, waiting_agent
from tools.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_model_call_naming_a_key_twice_is_invalid_and_told_to_the_model(worker, people, api):
    call = {"name": "wait_until", "arguments": '{"seconds": 1, "seconds": 100000}'}
    agent = waiting_agent(api(people["admin"]), "twice", call, final="Could not wait.")
    run = start_run(api(people["requester"]), agent, "Wait.")
    worker.drain()

    stored = ToolCall.objects.get(run_id=run["id"], name="wait_until")
    assert stored.status == "invalid" and "more than once" in stored.error
    told = tool_result(run["id"], "wait_until")
    assert told["status"] == "invalid" and "more than once" in told["error"]
    assert get_run(api(people["requester"]), run["id"])["status"] == "completed"


@pytest.mark.parametrize("until", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_wait_until_a_moment_utc_cannot_hold_is_refused_and_the_run_goes_on(worker, people, api, until):
    agent = waiting_agent(api(people["admin"]), "far-off", {"name": "wait_until", "arguments": {"until": until}},
                          final="That time cannot be waited for.")
    run = start_run(api(people["requester"]), agent, "Wait for the end of time.")
    worker.drain()

    finished = Run.objects.get(pk=run["id"])
    assert finished.status == "completed" and finished.failure_type == ""
    told = tool_result(run["id"], "wait_until")
    assert told["status"] == "denied" and "between the years 1 and 9999" in told["error"]


@pytest.mark.parametrize("query", ["day_to=9999-12-31", "day_from=9999-12-31", "day_from=0001-01-01",
                                   "day_from=0001-01-01&day_to=9999-12-31"])
def test_the_history_page_refuses_a_day_no_filter_can_span_with_a_400(client, people, settings, query):
    settings.TIME_ZONE = "Asia/Shanghai"  # east of Greenwich: 0001-01-01 starts before UTC's first moment
    client.force_login(people["approver"])
    response = client.get(f"/inbox/decided/?{query}")
    assert response.status_code == 400
    assert "out of range" in response.content.decode()
