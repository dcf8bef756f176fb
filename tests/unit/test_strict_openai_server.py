"""The strict OpenAI-compatible fake (tests/support/fakes/strict_openai.py) refuses what the real API refuses."""

import httpx
import pytest

from tests.support.fakes.strict_openai import StrictOpenAIServer, chat_request_problems

AUTH = {"authorization": "Bearer sk-test"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "find_flights", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "find_flights", "description": "d",
                                         "parameters": {"type": "object", "properties": {}}}}
GOOD = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "tools": [TOOL],
        "max_completion_tokens": 100, "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fly me."},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{}"},
            {"role": "user", "content": "[runtime] go on"}]}


def with_(**changes) -> dict:
    return {**GOOD, **changes}


def test_a_well_formed_request_passes():
    assert chat_request_problems(GOOD, AUTH) is None


@pytest.mark.parametrize("body, words", [
    (with_(foo=1), "Unrecognized request argument supplied: foo"),
    (with_(stream=False), "'stream_options' parameter is only allowed"),
    (with_(max_tokens=5), "cannot both be set"),
    (with_(messages=[{"role": "robot", "content": "x"}]), "Invalid value: 'robot'"),
    (with_(messages=[{"role": "user", "content": "x", "tool_calls": []}]), "'tool_calls' was unexpected"),
    (with_(messages=[{"role": "user", "content": None}]), "messages[0].content"),
    (with_(messages=GOOD["messages"][:3]), "did not have response messages: call_1"),
    (with_(messages=[GOOD["messages"][2], GOOD["messages"][1], GOOD["messages"][3]]), "did not have response"),
    (with_(messages=[GOOD["messages"][1], GOOD["messages"][3]]), "must be a response to a preceeding message"),
    (with_(tools=[{"type": "function", "function": {"name": "find flights"}}]), "does not match pattern"),
    (with_(tools=[TOOL, TOOL]), "duplicate function name"),
    (with_(messages=[GOOD["messages"][1], {**GOOD["messages"][2], "tool_calls": [
        {**CALL, "function": {"name": "crm.lookup", "arguments": "{}"}}]}, GOOD["messages"][3]]),
     "messages[1].tool_calls[0].function.name': string does not match pattern"),
    (with_(tools=[{"type": "function", "function": {"name": "x", "parameters": {"type": "array"}}}]), "type: \"object\""),
])
def test_what_the_real_api_refuses_is_refused(body, words):
    refused = chat_request_problems(body, AUTH)
    assert refused is not None and words in str(refused), refused


def test_over_http_a_refused_request_is_a_400_with_openais_error_body_and_uses_no_script_entry():
    with StrictOpenAIServer([{"content": "hello"}]) as server:
        url = server.base_url + "/chat/completions"
        refused = httpx.post(url, json=with_(foo=1), headers=AUTH)
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "invalid_request_error"
        plain = {key: value for key, value in GOOD.items() if key != "stream_options"}
        assert httpx.post(url, json={**plain, "stream": False}, headers={}).status_code == 401
        answered = httpx.post(url, json={**plain, "stream": False}, headers=AUTH)
        assert answered.status_code == 200, answered.text
        assert answered.json()["choices"][0]["message"]["content"] == "hello"
        assert [violation["param"] for violation in server.violations] == [None, None]
