"""Issue 9, "Prove": a bounded fuzz pass over every write endpoint and inbox form.

Hypothesis sends JSON nested far too deep, ``NaN``/``Infinity``, NUL
characters, huge numbers, wrong types and plain garbage, alone and in the
fields each endpoint reads. Every answer must be below 500, a 4xx must
carry the one error object and leave the database as it was. Small ``max_examples`` keep the whole
module to a few seconds per database.
"""

import json
import os

import pytest
from django.core.cache import cache
from django.urls import reverse
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.support.api import error_of
from tests.support.core import asking_agent
from tests.support.security import core_approval_item, core_reconciliation_item, stored_state  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("TOLLGATE_FUZZ_EXAMPLES", "25"))
FUZZ = hypothesis_settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                  HealthCheck.data_too_large])

text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["\x00", "a\x00b", "\u202e", ""])
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30),
                 st.floats(allow_nan=True, allow_infinity=True), text)
value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                     max_leaves=8)


def _deep(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "[" else '{"a":' * depth + "0" + "}" * depth


# Plausible values first, so a body gets past the shape check into the deeper code.
FIELDS = {
    "agent": st.sampled_from(["transfer-80", "transfer-5", "nope"]) | value,
    "input": st.just("Send 80 to acme.") | value,
    "session": st.integers(-(10**30), 10**30) | value,
    "multitask_strategy": st.sampled_from(["enqueue", "supplement", "interrupt", "reject"]) | value,
    "comment": text | value,
    "arguments": st.fixed_dictionaries({"account": st.just("acme") | value, "amount": value}) | value,
    "succeeded": st.booleans() | value,
    "evidence": st.just("ledger line 4") | value,
    "result": value,
    "slug": st.from_regex(r"[a-z]{1,8}", fullmatch=True) | value,
    "name": text | value,
    "model": st.fixed_dictionaries({"provider": st.sampled_from(["scripted", "openai"]) | value,
                                    "turns": st.lists(value, max_size=2), "base_url": value}) | value,
    "tools": st.lists(st.sampled_from(["fake_transfer", "fake_lookup"]) | value, max_size=2) | value,
    "max_turns": value, "max_model_calls": value, "max_total_tokens": value, "max_cost_usd": value,
    "deadline_s": value, "approval_policy": value, "completion_check": value,
    "title": text | value, "metadata": st.dictionaries(text, value, max_size=3) | value,
}
bodies = st.one_of(
    st.fixed_dictionaries({}, optional=FIELDS).map(lambda body: json.dumps(body, allow_nan=True)),
    value.map(lambda v: json.dumps(v, allow_nan=True)),
    st.builds(_deep, st.integers(20, 3000), st.sampled_from(["[", "{"])),
    st.sampled_from(['{"arguments": {"account": "acme", "amount": 1e309}}', '{"input": "x", "session": -1e999}',
                     '{"result": "\\u0000", "evidence": "x", "succeeded": true}', '{"agent": "transfer-80",']),
    text,
)


# Known-bad inputs from the issue, tried before the generated ones on every run.
KNOWN_BAD = ["[" * 1000 + "]" * 1000, '{"arguments": {"account": "acme", "amount": 1e309}}',
             '{"agent": "transfer-80", "input": "x", "session": 1' + "0" * 30 + "}",
             '{"succeeded": true, "evidence": "x", "result": {"a": "\\u0000"}, "comment": "\\u0000"}',
             '{"slug": "x", "name": "x", "model": {"provider": "openai", "model": "m", "base_url": 5}}']


def with_known_bad(test):
    """Add every ``KNOWN_BAD`` text as an explicit example of a test taking one text argument."""
    for bad in KNOWN_BAD:
        test = example(bad)(test)
    return test


def _write_urls(approval, reconciliation) -> dict[str, str]:
    return {"agents": "/api/agents/", "runs": "/api/runs/", "cancel": f"/api/runs/{approval.run_id}/cancel/",
            "approve": f"/api/interrupts/{approval.pk}/approve/", "reject": f"/api/interrupts/{approval.pk}/reject/",
            "reconcile": f"/api/interrupts/{reconciliation.pk}/reconcile/", "sessions": "/api/sessions/"}


@pytest.fixture
def still(worker):
    """The items are set up; the worker stops, so only the fuzzed request can change the database."""
    worker.drain()
    worker.worker.stop()


def _check(response, before, api: bool = True) -> None:
    assert response.status_code < 500
    if 400 <= response.status_code < 500:
        assert stored_state() == before, response.content[:300]
        if api:
            error_of(response, response.status_code)


@pytest.mark.parametrize("endpoint", ["agents", "runs", "cancel", "approve", "reject", "reconcile", "sessions"])
def test_write_endpoints_never_500_and_write_nothing_on_4xx(people, api, core_approval_item, core_reconciliation_item,
                                                           still, endpoint):
    url = _write_urls(core_approval_item, core_reconciliation_item)[endpoint]
    user = people["admin"] if endpoint == "agents" else people["approver"]
    client = api(user)

    @FUZZ
    @given(body=bodies)
    @with_known_bad
    def attempt(body):
        cache.clear()  # throttle counters: every example gets through to the view
        before = stored_state()
        _check(client.post(url, data=body.encode("utf-8", "surrogatepass"), content_type="application/json"), before)

    attempt()


form_text = text | bodies


def _post_form(client, url: str, data: dict):
    before = stored_state()
    _check(client.post(url, data), before, api=False)


def test_inbox_decision_form_never_500s(client, people, core_approval_item, still):
    client.force_login(people["approver"])
    url = f"/inbox/{core_approval_item.pk}/"

    @FUZZ
    @given(decision=st.sampled_from(["approved", "rejected"]) | text, comment=form_text, edited=form_text)
    @example("approved", "", '{"account": "acme", "amount": NaN}')
    @example("approved", "", '{"account": "acme", "amount": 1e309}')
    @example("approved", "", "[" * 1000 + "]" * 1000)
    def attempt(decision, comment, edited):
        _post_form(client, url, {"decision": decision, "comment": comment, "edited_arguments": edited})

    attempt()


def test_inbox_reconcile_form_never_500s(client, people, core_reconciliation_item, still):
    client.force_login(people["approver"])
    url = f"/inbox/{core_reconciliation_item.pk}/"

    @FUZZ
    @given(outcome=st.sampled_from(["succeeded", "failed"]) | text, evidence=form_text, result=form_text)
    @example("succeeded", "ledger", "Infinity")
    @example("succeeded", "ledger", '"\\u0000"')
    @example("succeeded", "ledger", "[" * 1000 + "]" * 1000)
    def attempt(outcome, evidence, result):
        _post_form(client, url, {"outcome": outcome, "evidence": evidence, "result": result})

    attempt()


def test_run_start_form_never_500s(client, people):
    client.force_login(people["requester"])
    agent = asking_agent().slug

    @FUZZ
    @given(agent=st.sampled_from([agent, "nope"]) | text | st.integers(-(10**30), 10**30).map(str),
           input_=form_text)
    def attempt(agent, input_):
        cache.clear()
        _post_form(client, reverse("run-start"), {"agent": agent, "input": input_})

    attempt()


def test_list_query_parameters_never_500(people, api, core_approval_item):
    client = api(people["approver"])
    names = ["run", "status", "kind", "tool", "agent", "session", "waiting_reason", "requested_by", "created_after",
             "created_before", "page_size", "cursor"]
    params = st.dictionaries(st.sampled_from(names), text | st.integers(-(10**40), 10**40).map(str), max_size=4)
    session = core_approval_item.run.session_id

    @FUZZ
    @example("/api/runs/", {"page_size": "9" * 30})
    @example("/api/runs/", {"cursor": "cD05OTk5OTk5OTk5OTk5OTk5OTk5OTk5OQ=="})  # p=9 * 23: fits no field
    @example("/api/runs/", {"created_after": "9999-12-31T23:59:59-23:59"})
    @example("/api/sessions/", {"cursor": "cD05OTk5LTEyLTMxVDIzOjU5OjU5LTIzOjU5"})  # that date-time as a position
    @given(path=st.sampled_from(["/api/runs/", "/api/interrupts/", "/api/agents/", "/api/sessions/",
                                 f"/api/runs/{core_approval_item.run_id}/events/",
                                 f"/api/runs/{core_approval_item.run_id}/tool-calls/",
                                 f"/api/sessions/{session}/messages/", f"/api/sessions/{session}/runs/"]),
           query=params)
    def attempt(path, query):
        cache.clear()
        response = client.get(path, query)
        assert response.status_code < 500
        if response.status_code >= 400:
            error_of(response, response.status_code)

    attempt()
