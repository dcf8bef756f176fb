"""Each budget, checked before every model call, ends the run naming itself."""

from decimal import Decimal

import pytest

from runs.engine.budgets import cost_usd
from tests.support.provider import LOOKUP_ACME, core_llm, events, run_to_rest  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
LOOKUP = {"tool_calls": [LOOKUP_ACME], "usage": {"input_tokens": 1000, "output_tokens": 200}}


def _budget_failure(run) -> str:
    last = events(run, "transition")[-1]
    assert (last.from_status, last.to_status) == ("running", "failed")
    return last.reason


def test_max_turns(worker, people, core_llm):
    server, agent = core_llm("openai", [LOOKUP] * 3, agent_fields={"max_turns": 2})
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "budget_exhausted")
    assert run.error == "Budget max_turns (2) exhausted: 2 model turns used."
    assert _budget_failure(run) == run.error
    assert len(server.requests) == 2


def test_max_model_calls_counts_discarded_answers(worker, people, core_llm):
    server, agent = core_llm("openai", [{"raw": "not json"}, LOOKUP, LOOKUP], stream=False,
                        agent_fields={"max_model_calls": 2})
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "budget_exhausted")
    assert run.error == "Budget max_model_calls (2) exhausted: 2 model calls used."
    assert (run.model_calls, run.steps.count(), len(server.requests)) == (1, 2, 2)


def test_max_total_tokens(worker, people, core_llm):
    server, agent = core_llm("anthropic", [LOOKUP] * 5, agent_fields={"max_total_tokens": 2000})
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "budget_exhausted")
    assert run.error == "Budget max_total_tokens (2000) exhausted: 2400 tokens used."
    assert (run.input_tokens, run.output_tokens) == (2000, 400)
    assert len(server.requests) == 2


def test_max_cost(worker, people, core_llm, settings):
    settings.TOLLGATE = {**settings.TOLLGATE,
                         "MODEL_PRICES": {"gpt-test": {"input_per_mtok": 2.5, "output_per_mtok": 10}}}
    per_call = cost_usd({"model": "gpt-test"}, input_tokens=1000, output_tokens=200)
    assert per_call == Decimal("0.004500")
    server, agent = core_llm("openai", [LOOKUP] * 5, agent_fields={"max_cost_usd": Decimal("0.01")})
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "budget_exhausted")
    assert run.error == "Budget max_cost_usd (0.010000) exhausted: 0.013500 USD used."
    assert run.cost_usd == 3 * per_call
    assert [s.cost_usd for s in run.steps.order_by("index")] == [per_call] * 3
    assert events(run, "model_call")[0].payload["cost_usd"] == "0.004500"


def test_max_cost_cannot_be_enforced_for_an_unpriced_model(worker, people, core_llm):
    server, agent = core_llm("openai", [LOOKUP], agent_fields={"max_cost_usd": Decimal("1")})
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "budget_exhausted")
    assert "no price for model 'gpt-test'" in run.error
    assert server.requests == []


def test_deadline(worker, people, core_llm):
    slow = {**LOOKUP, "delay_s": 3}
    server, agent = core_llm("openai", [slow, LOOKUP], agent_fields={"deadline_s": 1})
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "deadline_exceeded")
    assert run.error.startswith("Deadline deadline_s (1s) exceeded")
    step, = run.steps.all()  # the call is cut short at the deadline, not waited for
    assert step.status == "discarded" and "deadline passed" in step.error
    assert not run.tool_calls.exists()
