"""The fuzz pass of ``test_security_fuzz`` over the write endpoints and form of waiting runs.

``POST /api/events/``, ``/api/interrupts/{id}/respond/``, ``/api/runs/{id}/retry/``,
``POST /api/runs/`` with ``start_at``, and the answer form of an input item:
every answer is below 500, and a 4xx leaves the database as it was (waits
and external events included).
"""

import json

import pytest
from django.core.cache import cache
from hypothesis import example, given
from hypothesis import strategies as st

from approvals.models import Interrupt
from runs.models import Run
from tests.support.api import start_run
from tests.support.core import asking_agent, core_agent
from tests.support.security import stored_state
from tests.attack.test_fuzz import FUZZ, KNOWN_BAD, bodies, text, value
from tests.support.waits import waiting_agent
from tools.models import ExternalEvent, Wait

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "K-fuzz-0001"
AGENT = "send-80"  # asking_agent(AGENT), made by ``waits``
FIELDS = {
    "type": st.just("payment.settled") | text | value,
    "key": st.just(KEY) | text | value,
    "payload": value,
    "answer": st.sampled_from(["A", "B", "C", ""]) | text | value,
    "agent": st.just(AGENT) | value,
    "input": st.just("Send 80 to acme.") | value,
    "start_at": st.sampled_from(["2020-01-01T00:00:00Z", "2999-01-01T00:00:00Z", "soon"]) | text | value,
}
wait_bodies = st.fixed_dictionaries({}, optional=FIELDS).map(lambda body: json.dumps(body, allow_nan=True)) | bodies


def _state() -> tuple:
    return (stored_state(), tuple(Wait.objects.order_by("pk").values_list("pk", "status", "result")),
            ExternalEvent.objects.count())


@pytest.fixture
def waits(people, api, worker):
    """A run waiting on a question, one waiting on an event, and a failed run (and the agent ``AGENT``); then the
    worker stops."""
    asking_agent(AGENT)
    admin, requester = api(people["admin"]), api(people["requester"])
    asks = waiting_agent(admin, "fuzz-asks", {"name": "ask_user", "arguments": {"question": "A or B?",
                                                                                "options": ["A", "B"]}})
    listens = waiting_agent(admin, "fuzz-listens", {"name": "wait_for_event", "arguments": {
        "event_type": "payment.settled", "correlation_key": KEY, "timeout_s": 3600}})
    question, event = start_run(requester, asks, "Ask."), start_run(requester, listens, "Listen.")
    failed = start_run(requester, core_agent(admin, "fuzz-fails", [], tools=["ask_user"])["slug"], "Fail.")
    worker.drain()
    worker.worker.stop()
    assert Run.objects.get(pk=event["id"]).waiting_reason == "external_event"
    return {"item": Interrupt.objects.get(run_id=question["id"]), "failed": Run.objects.get(pk=failed["id"])}


@pytest.mark.parametrize("endpoint", ["events", "respond", "retry", "runs"])
def test_wait_endpoints_never_500_and_write_nothing_on_4xx(people, api, waits, endpoint):
    assert waits["failed"].status == "failed"
    url = {"events": "/api/events/", "respond": f"/api/interrupts/{waits['item'].pk}/respond/",
           "retry": f"/api/runs/{waits['failed'].pk}/retry/", "runs": "/api/runs/"}[endpoint]
    client = api(people["requester"])

    @FUZZ
    @given(body=wait_bodies)
    @example('{"type": "payment.settled", "key": "' + KEY + '", "payload": {"a": 1e309}}')
    @example('{"answer": "A\\u0000"}')
    @example('{"agent": "' + AGENT + '", "input": "x", "start_at": "2020-13-45T99:00:00Z"}')
    def attempt(body):
        cache.clear()
        before = _state()
        response = client.post(url, data=body.encode("utf-8", "surrogatepass"), content_type="application/json")
        assert response.status_code < 500
        if 400 <= response.status_code < 500:
            assert _state() == before, response.content[:300]

    for bad in KNOWN_BAD:
        attempt = example(bad)(attempt)
    attempt()


def test_answer_form_never_500s(client, people, waits):
    client.force_login(people["requester"])
    url = f"/inbox/{waits['item'].pk}/"

    @FUZZ
    @given(answer=text | bodies)
    @example("A\x00")
    @example("x" * 20_000)
    def attempt(answer):
        before = _state()
        response = client.post(url, {"answer": answer})
        assert response.status_code < 500
        if 400 <= response.status_code < 500:
            assert _state() == before
        else:  # answered: put the item back for the next example
            Interrupt.objects.filter(pk=waits["item"].pk).update(status="pending", decision="", comment="")
            Wait.objects.filter(tool_call_id=waits["item"].tool_call_id).update(status="pending", result=None)

    attempt()
