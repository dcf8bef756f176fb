"""The refund scenario through each real provider SDK against its local replay server."""

import json

import pytest

from runs.models import Step
from tests.support.provider import QUERY, REFUND_80, decide, llm, run_to_rest, tool_calls_sent, tool_results_sent  # noqa: F401
from tools.demo import gateway

pytestmark = pytest.mark.django_db(transaction=True)
PROVIDERS = ["openai", "anthropic"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_refund_end_to_end_with_usage_totals_from_the_payloads(worker, demo, llm, provider, stream, monkeypatch):
    deltas = []
    monkeypatch.setattr("runs.engine.loop.publish_delta", lambda run_id, *, kind, data: deltas.append((kind, data)))
    server, agent = llm(provider, [
        {"tool_calls": [QUERY], "usage": {"input_tokens": 101, "output_tokens": 11}},
        {"content": "Order 123 can be refunded; issuing 80.", "tool_calls": [REFUND_80],
         "usage": {"input_tokens": 202, "output_tokens": 22}},
        {"content": "A refund of 80.00 for order 123 has been issued.",
         "usage": {"input_tokens": 303, "output_tokens": 33}},
    ], stream=stream)

    run = run_to_rest(worker, agent, demo["requester"])
    assert (run.status, run.waiting_reason) == ("waiting", "approval")
    assert len(server.requests) == 2
    assert gateway.ledger()["refunds"] == []

    run = decide(worker, run, demo["approver"], "approved")
    assert (run.status, run.outcome) == ("completed", "achieved")
    assert run.final_output == "A refund of 80.00 for order 123 has been issued."
    assert (run.input_tokens, run.output_tokens) == (101 + 202 + 303, 11 + 22 + 33)
    assert [(s.input_tokens, s.output_tokens) for s in run.steps.order_by("index")] == [(101, 11), (202, 22), (303, 33)]
    refund, = gateway.ledger()["refunds"]
    assert (refund["order_id"], float(refund["amount"])) == (123, 80)
    assert run.tool_calls.get(name="refund").status == "succeeded"

    first, second, third = server.bodies()
    assert first.get("stream", False) is stream
    assert [t.get("name") or t["function"]["name"] for t in first["tools"]] == ["query_order", "refund"]
    query_id, refund_id = tool_calls_sent(provider, third)
    results = tool_results_sent(provider, third)
    assert json.loads(results[query_id])["result"]["order_id"] == 123
    assert json.loads(results[refund_id])["status"] == "succeeded"
    if stream:
        kinds = {kind for kind, _ in deltas}
        assert kinds == {"text_delta", "tool_call_delta"}
        streamed = "".join(d["arguments"] for k, d in deltas if k == "tool_call_delta" and d["name"] == "refund")
        assert json.loads(streamed) == {"order_id": 123, "amount": 80}
    else:
        assert deltas == []
    assert run.events.filter(type="transition", to_status="running").count() >= 2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_parallel_calls_one_rejected_every_call_id_gets_a_result(worker, demo, llm, provider):
    server, agent = llm(provider, [
        {"tool_calls": [QUERY, REFUND_80]},
        {"content": "The refund was not approved."},
    ])

    run = run_to_rest(worker, agent, demo["requester"])
    assert (run.status, run.waiting_reason) == ("waiting", "approval")
    query, refund = run.tool_calls.order_by("index")
    assert (query.status, refund.status) == ("succeeded", "awaiting_approval")
    assert len(server.requests) == 1, "no model call while a call of the turn is unresolved"

    run = decide(worker, run, demo["approver"], "rejected", comment="too much")
    assert (run.status, run.outcome) == ("completed", "not_achieved")
    assert gateway.ledger()["refunds"] == []
    body = server.bodies()[1]
    ids = tool_calls_sent(provider, body)
    assert ids == [query.provider_call_id, refund.provider_call_id]
    results = tool_results_sent(provider, body)
    assert set(results) == set(ids)
    assert json.loads(results[refund.provider_call_id]) == {
        "status": "rejected", "error": "A person rejected this call. Comment: too much"}
    if provider == "anthropic":
        tool_turn = next(m for m in body["messages"] if m["role"] == "user" and m["content"][0]["type"] == "tool_result")
        assert [b["type"] for b in tool_turn["content"]][:2] == ["tool_result", "tool_result"]


def test_step_records_the_context_summary(worker, demo, llm):
    server, agent = llm("openai", [{"tool_calls": [QUERY]}, {"content": "Sorry, I cannot refund that."}] * 3)
    run = run_to_rest(worker, agent, demo["requester"])
    step = Step.objects.filter(run=run).order_by("index").first()
    assert step.request["turn_index"] == 0
    assert step.request["omitted_messages"] == 0
    assert step.request["estimated_tokens"] > 0
