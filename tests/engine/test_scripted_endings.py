"""Scripted endings follow what happened: ``content_by_status`` picks the final text by the last tool result.

The provider on its own (the choice, the placeholders, the config checks);
the demo agents' endings are in tests/demo/test_scripted_endings.py.
"""

import asyncio
import json

import pytest

from runs.base.model_call import ModelRequest
from runs.providers.scripted import ScriptedClient, config_problems

ENDING = {"content": "Something happened.", "content_by_status": {
    "succeeded": "Refunded {result.amount} on order {result.order_id}.",
    "edited": "Refunded {result.amount} (changed by the approver).",
    "rejected": "Not approved: {error}",
    "denied": "Refused: {error} ({result.amount})",
}}


def answer(turn: dict, *results: dict) -> str:
    """The content a one-turn scripted model answers after ``results`` (tool result bodies, in order)."""
    messages = [{"role": "user", "content": "Refund order 123."}]
    for number, body in enumerate(results):
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{number}", "name": "refund",
                                                                           "arguments": "{}"}]},
                     {"role": "tool", "tool_call_id": f"c{number}", "content": json.dumps(body)}]
    request = ModelRequest(instructions="", messages=messages, tools=[], turn_index=0, run_id=1)
    return asyncio.run(ScriptedClient({"turns": [turn]}).complete(request)).content


SUCCEEDED = {"status": "succeeded", "result": {"order_id": 123, "amount": "80.00"}}
EDITED = {"status": "succeeded", "result": {"order_id": 123, "amount": "20.00"},
          "approval": {"comment": "", "proposed_arguments": {"order_id": 123, "amount": 80},
                       "approved_arguments": {"order_id": 123, "amount": 20}}}
REJECTED = {"status": "rejected", "error": "A person rejected this call. Comment: too much"}
DENIED = {"status": "denied", "error": "at most 40.00 can be refunded"}


@pytest.mark.parametrize("results, expected", [
    ([SUCCEEDED], "Refunded 80.00 on order 123."),
    ([EDITED], "Refunded 20.00 (changed by the approver)."),
    ([REJECTED], "Not approved: A person rejected this call. Comment: too much"),
    ([DENIED], "Refused: at most 40.00 can be refunded ({result.amount})"),  # a value the result lacks stays
    ([{"status": "failed", "error": "gateway down"}], "Something happened."),  # not listed: content
    ([], "Something happened."),  # no tool result
    ([REJECTED, SUCCEEDED], "Refunded 80.00 on order 123."),  # the last result speaks
], ids=["succeeded", "edited", "rejected", "denied", "unlisted", "no-result", "last"])
def test_the_final_text_follows_the_last_tool_result(results, expected):
    assert answer(ENDING, *results) == expected


def test_an_edited_call_without_an_edited_text_gets_the_succeeded_one():
    turn = {"content_by_status": {"succeeded": "Refunded {result.amount}."}}
    assert answer(turn, EDITED) == "Refunded 20.00."


def test_a_plain_content_is_never_filled_in():
    assert answer({"content": "Use {result.amount} literally."}, SUCCEEDED) == "Use {result.amount} literally."


def test_a_call_argument_that_is_one_placeholder_takes_the_typed_value_of_the_last_result():
    turn = {"tool_calls": [{"name": "refund", "arguments": {
        "order_id": "{result.order_id}", "amount": 60, "note": "order {result.order_id}", "missing": "{result.x}"}}]}
    messages = [{"role": "user", "content": "Refund."},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "name": "find", "arguments": "{}"}]},
                {"role": "tool", "tool_call_id": "c0", "content": json.dumps(SUCCEEDED)}]
    request = ModelRequest(instructions="", messages=messages, tools=[], turn_index=0, run_id=1)
    call, = asyncio.run(ScriptedClient({"turns": [turn]}).complete(request)).tool_calls

    assert json.loads(call["arguments"]) == {"order_id": 123, "amount": 60, "note": "order {result.order_id}",
                                             "missing": "{result.x}"}  # only a lone placeholder, only if found


@pytest.mark.parametrize("by_status, problem", [
    ("Done.", "Turn 1: 'content_by_status' must be an object of strings."),
    ({"succeeded": 3}, "Turn 1: 'content_by_status' must be an object of strings."),
    ({"approved": "Done.", "succeeded": "Done."}, "Turn 1: 'content_by_status' has unknown statuses approved; "
                                                  "known: succeeded, edited, invalid, denied, rejected, expired, "
                                                  "cancelled, failed, unknown, pending."),
])
def test_a_bad_content_by_status_is_refused_when_the_agent_is_created(people, api, by_status, problem):
    assert config_problems({"turns": [{"content": "x", "content_by_status": by_status}]}) == [problem]
    body = {"slug": "bad-ending", "name": "Bad ending", "tools": ["fake_transfer"],
            "model": {"provider": "scripted", "turns": [{"content": "x", "content_by_status": by_status}]}}
    response = api(people["admin"]).post("/api/agents/", body, format="json")
    assert response.status_code == 400
    assert problem in json.dumps(response.json())
