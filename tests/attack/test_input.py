"""Issue 9, item 7 (and the unknown-field part of 8): bad input is a 4xx with nothing written, never a 500.

Each test sends what an attacker or a careless client would: JSON nested
far too deep, ``NaN``/``Infinity``/``1e309``, ``\\u0000``, huge integers,
misspelt fields, path tricks. Run on SQLite and PostgreSQL by tests/run.sh.
The strict JSON parser and the admin's agent form on their own are
tests/unit/test_hostile_json.py.
"""

import json

import pytest

from approvals.models import Interrupt
from runs.models import Agent, Run
from tests.support.api import error_of, field_errors
from tests.support.core import asking_agent
from tests.support.security import DEEP, core_approval_item, core_reconciliation_item, stored_state  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE_BODIES = {
    "deep array": DEEP,
    "deep object": '{"a":' * 1000 + "1" + "}" * 1000,
    "NaN": '{"agent": "transfer-80", "input": NaN, "arguments": {"amount": NaN}}',
    "Infinity": '{"agent": "transfer-80", "input": "x", "arguments": {"amount": Infinity}}',
    "-Infinity": '{"agent": "transfer-80", "input": "x", "arguments": {"amount": -Infinity}}',
    "overflowing float": '{"agent": "transfer-80", "input": "x", "arguments": {"amount": 1e309}}',
    "huge integer": '{"agent": "transfer-80", "input": "x", "session": ' + "9" * 30 + "}",
    "NUL": '{"agent": "transfer-80", "input": "a\\u0000b", "comment": "\\u0000", "evidence": "\\u0000"}',
    "not JSON": '{"agent": ',
}


def _write_endpoints(item_id: int, run_id: int) -> list[str]:
    return ["/api/agents/", "/api/runs/", f"/api/runs/{run_id}/cancel/", f"/api/interrupts/{item_id}/approve/",
            f"/api/interrupts/{item_id}/reject/", f"/api/interrupts/{item_id}/reconcile/"]


@pytest.mark.parametrize("case", sorted(HOSTILE_BODIES))
def test_hostile_json_is_400_with_nothing_written_on_every_write_endpoint(people, api, core_approval_item, case):
    before = stored_state()
    for url in _write_endpoints(core_approval_item.pk, core_approval_item.run_id):
        response = api(people["admin"]).post(url, data=HOSTILE_BODIES[case], content_type="application/json")
        error_of(response, 400)
        assert "Traceback" not in response.content.decode() and "File \"" not in response.content.decode()
    assert stored_state() == before


def test_approve_with_an_overflowing_amount_is_400_and_nothing_is_saved(people, api, core_approval_item):
    before = stored_state()
    response = api(people["approver"]).post(f"/api/interrupts/{core_approval_item.pk}/approve/",
                                          data='{"arguments": {"account": "acme", "amount": 1e309}}',
                                          content_type="application/json")
    assert "too large" in error_of(response, 400)["message"]
    assert stored_state() == before
    core_approval_item.refresh_from_db()
    assert (core_approval_item.status, core_approval_item.edited_arguments) == ("pending", None)


@pytest.mark.parametrize("text", ['{"account": "acme", "amount": NaN}', '{"account": "acme", "amount": Infinity}',
                                  '{"account": "acme", "amount": 1e309}', '{"a": "\\u0000"}',
                                  '{"a":' * 500 + "1" + "}" * 500])
def test_inbox_decision_form_refuses_hostile_json_with_a_message(client, people, core_approval_item, text):
    client.force_login(people["approver"])
    before = stored_state()
    response = client.post(f"/inbox/{core_approval_item.pk}/", {"decision": "approved", "comment": "",
                                                            "edited_arguments": text})
    assert response.status_code == 400
    assert 'class="errorlist' in response.content.decode()
    assert stored_state() == before


@pytest.mark.parametrize("text", ['{"ok": NaN}', '{"ok": -Infinity}', "[" * 2000 + "]" * 2000, '"\\u0000"',
                                  "1" + "0" * 400])
def test_inbox_reconcile_form_refuses_hostile_json_with_a_message(client, people, core_reconciliation_item, text):
    client.force_login(people["approver"])
    before = stored_state()
    response = client.post(f"/inbox/{core_reconciliation_item.pk}/", {"outcome": "succeeded", "evidence": "ledger",
                                                                 "result": text})
    assert response.status_code == 400
    assert stored_state() == before


def test_integer_query_parameters_are_bounded(people, api):
    client = api(people["approver"])
    huge = "9" * 30
    for bad in (huge, "0", "-1", "²", "1.5", "abc", "1\x00"):
        for url, name in (("/api/interrupts/", "run"), ("/api/runs/", "session"), ("/api/runs/", "page_size"),
                          ("/api/interrupts/", "page_size")):
            assert name in field_errors(client.get(url, {name: bad})), (url, name, bad)
    assert client.get(f"/api/runs/{huge}/").status_code == 404
    assert client.get(f"/api/interrupts/{huge}/").status_code == 404


def test_path_tricks_under_static_are_404(client):
    for path in ("/static/../config/settings.py", "/static/%2e%2e/config/settings.py", "/static/..%2fmanage.py"):
        assert client.get(path).status_code == 404, path
    assert client.get("/static/css/tollgate.css").status_code == 200


def test_misspelt_fields_are_refused_on_every_write_endpoint(people, api, core_approval_item, core_reconciliation_item):
    before = stored_state()
    requester, approver, admin = api(people["requester"]), api(people["approver"]), api(people["admin"])
    cases = [
        (requester, "/api/runs/", {"agent": "transfer-80", "input": "x", "multitask_stratgy": "reject"},
         "multitask_stratgy"),
        (requester, f"/api/runs/{core_approval_item.run_id}/cancel/", {"reason": "typo"}, "reason"),
        (approver, f"/api/interrupts/{core_approval_item.pk}/approve/", {"argument": {"amount": 1}}, "argument"),
        (approver, f"/api/interrupts/{core_approval_item.pk}/reject/", {"comment": "no", "commment": "x"}, "commment"),
        (approver, f"/api/interrupts/{core_reconciliation_item.pk}/reconcile/",
         {"succeeded": True, "evidence": "x", "reslut": {}}, "reslut"),
        (admin, "/api/agents/", {"slug": "typo", "name": "Typo", "model": {"provider": "scripted", "turns": []},
                                 "max_model_call": 3}, "max_model_call"),
    ]
    for client, url, body, field in cases:
        response = client.post(url, body, format="json")
        assert field in field_errors(response), (url, response.json())
    assert stored_state() == before


def test_error_texts_do_not_echo_python_internals(people, api):
    client = api(people["approver"])
    for url in ("/api/interrupts/abc/approve/", "/api/runs/abc/cancel/", "/api/interrupts/abc/reconcile/"):
        response = client.post(url, {}, format="json")
        assert response.status_code == 404
        assert "expected a number" not in response.content.decode()
    response = client.post("/api/runs/", data='{"input": "x",,}', content_type="application/json")
    assert "char " not in error_of(response, 400)["message"]


def test_nothing_reached_the_database_through_a_nul_in_a_run_input(people, api):
    agent = asking_agent()
    agents = Agent.objects.count()
    response = api(people["requester"]).post("/api/runs/", {"agent": agent.slug, "input": "a\x00b"}, format="json")
    assert response.status_code == 400
    assert not Run.objects.exists() and Interrupt.objects.count() == 0 and Agent.objects.count() == agents
    assert json.loads(response.content)  # a JSON error body, not a page
