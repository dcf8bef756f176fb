"""Every kind of bad model output, through each provider's streamed wire format.

Invalid tool calls are recorded, never executed, and answered with a tool
result that explains the error; a model that keeps producing nothing
usable ends ``failed/invalid_model_output``.
"""

import json

import pytest

from tests.support.fake_tools import transfers
from tests.support.provider import TRANSFER_5, core_llm, events, run_to_rest, tool_results_sent  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
PROVIDERS = ["openai", "anthropic"]
RECOVER = [{"tool_calls": [TRANSFER_5]}, {"content": "Sent 5 to acme."}]


def _bad_call_then_recover(worker, people, core_llm, provider, call, **turn):
    server, agent = core_llm(provider, [{"tool_calls": [call], **turn}, *RECOVER])
    run = run_to_rest(worker, agent, people["requester"], "Send 5 to acme.")
    assert (run.status, run.outcome) == ("completed", "achieved")
    bad = run.tool_calls.order_by("id").first()
    assert bad.status == "invalid"
    assert bad.started_at is None and bad.idempotency_key == ""
    sent = tool_results_sent(provider, server.bodies()[1])
    assert json.loads(sent[bad.provider_call_id])["status"] == "invalid"
    assert [t["amount"] for t in transfers()] == [5]
    repair = events(run, "repair")
    assert len(repair) == 1 and "invalid" in repair[0].reason
    return bad


@pytest.mark.parametrize("provider", PROVIDERS)
def test_arguments_cut_off_by_the_output_limit_are_invalid_and_never_executed(worker, people, core_llm, provider):
    cut = {"name": "fake_transfer", "arguments": '{"account": "acme", "amou'}
    bad = _bad_call_then_recover(worker, people, core_llm, provider, cut, finish_reason="length")
    assert "cut off" in bad.error
    assert bad.raw_arguments == '{"account": "acme", "amou'


@pytest.mark.parametrize("provider", PROVIDERS)
def test_complete_looking_arguments_are_still_invalid_when_the_stream_was_cut(worker, people, core_llm, provider):
    cut = {"name": "fake_transfer", "arguments": '{"account": "acme", "amount": 5}'}
    bad = _bad_call_then_recover(worker, people, core_llm, provider, cut, finish_reason="length")
    assert "cut off" in bad.error and bad.arguments in (None, {})


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unknown_tool_name_is_invalid(worker, people, core_llm, provider):
    bad = _bad_call_then_recover(worker, people, core_llm, provider, {"name": "delete_all_accounts", "arguments": "{}"})
    assert "Unknown tool 'delete_all_accounts'" in bad.error


@pytest.mark.parametrize("provider", PROVIDERS)
def test_arguments_that_are_not_json_are_invalid(worker, people, core_llm, provider):
    bad = _bad_call_then_recover(worker, people, core_llm, provider,
                                 {"name": "fake_transfer", "arguments": "{account: acme, amount: 5"})
    assert "not valid JSON" in bad.error


@pytest.mark.parametrize("provider", PROVIDERS)
def test_arguments_breaking_the_schema_are_invalid(worker, people, core_llm, provider):
    call = {"name": "fake_transfer", "arguments": json.dumps({"account": 123, "amount": -5})}
    bad = _bad_call_then_recover(worker, people, core_llm, provider, call)
    assert "do not match the schema" in bad.error and "account" in bad.error


@pytest.mark.parametrize("provider", PROVIDERS)
def test_empty_responses_end_in_invalid_model_output(worker, people, core_llm, provider, settings):
    limit = settings.TOLLGATE["MAX_REPAIR_TURNS"]
    server, agent = core_llm(provider, [{"content": ""}] * (limit + 1))
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "invalid_model_output")
    assert "neither text nor tool calls" in run.error
    assert len(server.requests) == limit + 1
    assert len(events(run, "repair")) == limit
    assert run.messages.filter(role="system", content__contains="empty").count() == limit


@pytest.mark.parametrize("provider", PROVIDERS)
def test_one_empty_response_is_repaired(worker, people, core_llm, provider):
    server, agent = core_llm(provider, [{"content": ""}, *RECOVER])
    run = run_to_rest(worker, agent, people["requester"], "Send 5 to acme.")
    assert (run.status, run.outcome) == ("completed", "achieved")
    last_user_text = json.dumps(server.bodies()[1]["messages"][-1])
    assert "Your last reply was empty" in last_user_text


@pytest.mark.parametrize("provider", PROVIDERS)
def test_body_that_is_not_json_is_discarded_and_re_requested(worker, people, core_llm, provider):
    server, agent = core_llm(provider, [{"raw": "<html>bad gateway</html>"}, *RECOVER], stream=False)
    run = run_to_rest(worker, agent, people["requester"], "Send 5 to acme.")
    assert (run.status, run.outcome) == ("completed", "achieved")
    malformed, = [e for e in events(run, "model_call") if e.reason == "malformed response"]
    assert "Malformed" in malformed.payload["error"]
    assert run.steps.filter(status="failed").count() == 1
    assert run.model_calls == 2  # the discarded answer is not a turn


@pytest.mark.parametrize("provider", PROVIDERS)
def test_half_received_stream_is_discarded_until_the_repair_budget_is_spent(worker, people, core_llm, provider,
                                                                           settings):
    limit = settings.TOLLGATE["MAX_REPAIR_TURNS"]
    first_event = ('data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
                   '"delta":{"content":"Hel"},"finish_reason":null}]}\n\n') if provider == "openai" else (
        'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message","role":"assistant",'
        '"content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}\n\n')
    cut = {"raw": first_event, "content_type": "text/event-stream"}
    server, agent = core_llm(provider, [cut] * (limit + 1))
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "invalid_model_output")
    assert "malformed response" in run.error and "ended without" in run.error
    assert len(server.requests) == limit + 1
