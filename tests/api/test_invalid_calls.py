"""Invalid tool calls are never executed; the model hears the error and may repair it."""

import json

import pytest

from tests.support.api import get_run, start_run, tool_calls, tool_messages
from tests.support.core import core_agent, transfer
from tests.support.fake_tools import transfer_made_under, transfers

SMALL_TRANSFER = transfer("acme", 5)  # under the approval threshold

INVALID_TURNS = {
    "schema mismatch": ({"tool_calls": [{"name": "fake_transfer", "arguments": {"account": "acme", "amount": "lots"}}]},
                        "do not match the schema"),
    "malformed JSON": ({"tool_calls": [{"name": "fake_transfer",
                                        "arguments": "{\"account\": \"acme\", \"amount\": 5"}]}, "not valid JSON"),
    "truncated": ({"tool_calls": [{"name": "fake_transfer", "arguments": "{\"account\": \"acme\", \"amo"}],
                   "finish_reason": "length"}, "cut off"),
    "unknown tool": ({"tool_calls": [{"name": "transfer_everything", "arguments": {"account": "acme"}}]},
                     "Unknown tool"),
}


@pytest.mark.parametrize("kind", INVALID_TURNS)
def test_invalid_call_is_reported_to_the_model_which_then_corrects_itself(worker, people, api, kind):
    invalid_turn, expected_error = INVALID_TURNS[kind]
    agent = core_agent(api(people["admin"]), "repairs", [
        invalid_turn,
        {"tool_calls": [SMALL_TRANSFER]},
        {"content": "Sent 5."},
    ])
    requester = api(people["requester"])
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
    made, = transfers()
    assert transfer_made_under(corrected["idempotency_key"]) == made


def test_truncated_call_keeps_the_raw_arguments_verbatim(worker, people, api):
    raw = "{\"account\": \"acme\", \"amount\": 5}"
    agent = core_agent(api(people["admin"]), "cut-off", [
        {"tool_calls": [{"name": "fake_transfer", "arguments": raw}], "finish_reason": "length"},
        {"tool_calls": [SMALL_TRANSFER]},
        {"content": "Sent."},
    ])
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"])
    worker.drain()

    truncated = tool_calls(requester, run["id"])[0]
    assert truncated["status"] == "invalid"
    assert truncated["raw_arguments"] == raw
    assert len(transfers()) == 1  # only the corrected call's transfer


@pytest.mark.parametrize("kind", INVALID_TURNS)
def test_model_that_keeps_making_invalid_calls_fails_the_run(worker, people, api, settings, kind):
    assert settings.TOLLGATE["MAX_REPAIR_TURNS"] == 2
    invalid_turn, _ = INVALID_TURNS[kind]
    agent = core_agent(api(people["admin"]), "never-repairs", [invalid_turn] * 3 + [{"tool_calls": [SMALL_TRANSFER]}])
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"])
    worker.drain()

    run = get_run(requester, run["id"])
    assert (run["status"], run["failure_type"]) == ("failed", "invalid_model_output")
    assert run["model_calls"] == 3
    assert [c["status"] for c in tool_calls(requester, run["id"])] == ["invalid"] * 3
    assert transfers() == []
