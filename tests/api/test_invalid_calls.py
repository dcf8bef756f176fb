"""Invalid tool calls are never executed; the model hears the error and may repair it."""

import json

import pytest

from tests.support.api import create_agent, gateway_refunds, get_run, start_run, tool_calls, tool_messages

SMALL_REFUND = {"name": "refund", "arguments": {"order_id": 123, "amount": 30}}  # under the approval threshold

INVALID_TURNS = {
    "schema mismatch": ({"tool_calls": [{"name": "refund", "arguments": {"order_id": 123, "amount": "lots"}}]},
                        "do not match the schema"),
    "malformed JSON": ({"tool_calls": [{"name": "refund", "arguments": "{\"order_id\": 123, \"amount\": 30"}]},
                       "not valid JSON"),
    "truncated": ({"tool_calls": [{"name": "refund", "arguments": "{\"order_id\": 123, \"amo"}],
                   "finish_reason": "length"}, "cut off"),
    "unknown tool": ({"tool_calls": [{"name": "refund_everything", "arguments": {"order_id": 123}}]},
                     "Unknown tool"),
}


@pytest.mark.parametrize("kind", INVALID_TURNS)
def test_invalid_call_is_reported_to_the_model_which_then_corrects_itself(worker, demo, api, kind):
    invalid_turn, expected_error = INVALID_TURNS[kind]
    agent = create_agent(api(demo["admin"]), "repairs", [
        invalid_turn,
        {"tool_calls": [SMALL_REFUND]},
        {"content": "Refunded 30.00."},
    ])
    requester = api(demo["requester"])
    run = start_run(requester, agent["slug"])
    worker.drain()

    invalid, corrected = tool_calls(requester, run["id"])
    assert invalid["status"] == "invalid"
    assert expected_error in invalid["error"]
    assert (invalid["attempts"], invalid["idempotency_key"], invalid["result"]) == (0, "", None)
    first_result = json.loads(tool_messages(run["id"])[0])
    assert first_result["status"] == "invalid"
    assert expected_error in first_result["error"]

    assert corrected["status"] == "succeeded"
    run = get_run(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    refund, = gateway_refunds()
    assert refund["idempotency_key"] == corrected["idempotency_key"]


def test_truncated_call_keeps_the_raw_arguments_verbatim(worker, demo, api):
    raw = "{\"order_id\": 123, \"amount\": 30}"
    agent = create_agent(api(demo["admin"]), "cut-off", [
        {"tool_calls": [{"name": "refund", "arguments": raw}], "finish_reason": "length"},
        {"tool_calls": [SMALL_REFUND]},
        {"content": "Refunded."},
    ])
    requester = api(demo["requester"])
    run = start_run(requester, agent["slug"])
    worker.drain()

    truncated = tool_calls(requester, run["id"])[0]
    assert truncated["status"] == "invalid"
    assert truncated["raw_arguments"] == raw
    assert len(gateway_refunds()) == 1  # only the corrected call's refund


@pytest.mark.parametrize("kind", INVALID_TURNS)
def test_model_that_keeps_making_invalid_calls_fails_the_run(worker, demo, api, settings, kind):
    assert settings.TOLLGATE["MAX_REPAIR_TURNS"] == 2
    invalid_turn, _ = INVALID_TURNS[kind]
    agent = create_agent(api(demo["admin"]), "never-repairs", [invalid_turn] * 3 + [{"tool_calls": [SMALL_REFUND]}])
    requester = api(demo["requester"])
    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["failure_type"]) == ("failed", "invalid_model_output")
    assert run["model_calls"] == 3
    assert [c["status"] for c in tool_calls(requester, run["id"])] == ["invalid"] * 3
    assert len(gateway_refunds()) == 0
