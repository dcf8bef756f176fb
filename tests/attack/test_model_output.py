"""Untrusted model output is refused at the door, never a database error (issue 9, item 5).

A model that keeps sending ``NaN``, ``Infinity``, ``1e309``, NUL
characters or over-long ids gets ``invalid`` results and the run ends
``failed/invalid_model_output`` once the repair turns are spent, on either
database, with no step discarded. Header fields of an email are single
lines, and a header Django refuses is a failed call, not an unknown one.
The argument parser on its own is tests/unit/test_model_arguments.py.
"""

import json

import pytest
from django.conf import settings

from runs.engine.agents import create_agent
from runs.models import Agent, Run
from runs.engine.lifecycle import start_run
from tests.support.provider import REFUND_30, llm  # noqa: F401
from tools.demo.data import CONTRACT_TEXT


pytestmark = pytest.mark.django_db(transaction=True)
LONG_ID = "x" * 200


def _repeating_agent(slug: str, call: dict) -> Agent:
    turns = [{"tool_calls": [call]}] * (settings.TOLLGATE["MAX_REPAIR_TURNS"] + 2)
    return create_agent(slug=slug, name=slug, model={"provider": "scripted", "turns": turns},
                        tools=["query_order", "refund"], completion_check="refund")


def _assert_refused_until_the_run_fails(run: Run) -> None:
    run.refresh_from_db()
    assert (run.status, run.failure_type) == ("failed", "invalid_model_output")
    assert not run.steps.filter(status="discarded").exists()
    calls = list(run.tool_calls.all())
    assert len(calls) == settings.TOLLGATE["MAX_REPAIR_TURNS"] + 1
    assert {call.status for call in calls} == {"invalid"}
    delivered = [json.loads(c) for c in run.messages.filter(role="tool").values_list("content", flat=True)]
    assert delivered and all(result["status"] == "invalid" for result in delivered)


BAD_ARGUMENTS = {
    "nan": '{"order_id": 123, "amount": NaN}',
    "infinity": '{"order_id": 123, "amount": Infinity}',
    "minus-infinity": '{"order_id": 123, "amount": -Infinity}',
    "overflow": '{"order_id": 123, "amount": 1e309}',
    "nul": '{"order_id": 123, "amount": 30, "memo": "\\u0000"}',
}


@pytest.mark.parametrize("kind", BAD_ARGUMENTS)
def test_scripted_model_repeating_unsafe_arguments_ends_invalid_model_output(demo, worker, kind):
    agent = _repeating_agent(f"bad-{kind}", {"name": "refund", "arguments": BAD_ARGUMENTS[kind]})
    run = start_run(agent=agent, user=demo["requester"], input="Refund order 123.")
    worker.drain()

    _assert_refused_until_the_run_fails(run)
    assert run.interrupts.count() == 0


def test_scripted_model_repeating_a_200_character_call_id_ends_invalid_model_output(demo, worker):
    call = {"id": LONG_ID, "name": "refund", "arguments": json.dumps({"order_id": 123, "amount": 30})}
    agent = _repeating_agent("long-id", call)
    run = start_run(agent=agent, user=demo["requester"], input="Refund order 123.")
    worker.drain()

    _assert_refused_until_the_run_fails(run)
    first = run.tool_calls.order_by("id").first()
    assert len(first.provider_call_id) <= 100 and "id" in first.error
    proposed = run.events.filter(type="tool_call", reason="proposed").first()
    assert proposed.payload["original_id"] == LONG_ID


@pytest.mark.parametrize("call", [
    {"id": "call\x00one", "name": "refund", "arguments": json.dumps({"order_id": 123, "amount": 30})},
    {"name": "refund\x00", "arguments": json.dumps({"order_id": 123, "amount": 30})},
    {"name": "r" * 300, "arguments": json.dumps({"order_id": 123, "amount": 30})},
    {"name": "refund", "arguments": '{"order_id": 123, "amount": 3\x000}'},
], ids=["nul-in-id", "nul-in-name", "long-name", "raw-nul"])
def test_a_server_sending_nul_or_long_names_gets_invalid_calls_until_the_run_fails(demo, worker, llm, call):
    turns = [{"content": "Working\x00.", "tool_calls": [call]}] * (settings.TOLLGATE["MAX_REPAIR_TURNS"] + 1)
    server, agent = llm("openai", turns)
    run = start_run(agent=agent, user=demo["requester"], input="Refund order 123.")
    worker.drain()

    _assert_refused_until_the_run_fails(run)
    assistant = run.messages.filter(role="assistant").first()
    assert assistant.content == "Working."


def test_nul_in_the_final_answer_is_removed_not_a_crash(demo, worker, llm):
    server, agent = llm("anthropic", [{"tool_calls": [REFUND_30]}, {"content": "Refunded\x00 30."}])
    run = start_run(agent=agent, user=demo["requester"], input="Refund 30 on order 123.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.outcome, run.final_output) == ("completed", "achieved", "Refunded 30.")


def _email_agent(subject: str) -> Agent:
    legal = {"name": "legal_check", "arguments": {"text": CONTRACT_TEXT}}
    send = {"name": "send_email",
            "arguments": {"to": "customer@example.com", "subject": subject, "body": CONTRACT_TEXT}}
    return create_agent(slug="header-injection", name="Header injection", tools=["legal_check", "send_email"],
                        model={"provider": "scripted", "turns": [{"tool_calls": [legal]}, {"tool_calls": [send]},
                                                                 {"content": "Sent."}]})


@pytest.mark.parametrize("subject", ["Your contract\r\nBcc: all@example.com", "Your contract\nX-Evil: 1",
                                     # str.splitlines (and a mail library folding a header) breaks at these too
                                     "Your\vcontract", "Your\fcontract", "Your\x1ccontract", "Your\u2028contract",
                                     "Your\x85contract"])
def test_an_email_subject_with_a_line_break_is_an_invalid_call_never_unknown(demo, worker, subject):
    run = start_run(agent=_email_agent(subject), user=demo["requester"], input="Send the contract.")
    worker.drain()
    run.refresh_from_db()

    send = run.tool_calls.get(name="send_email")
    assert send.status == "invalid" and "header-text" in send.error
    assert not run.tool_calls.filter(status="unknown").exists()
    assert run.interrupts.count() == 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("tokens", [-5, 10**12])
def test_token_counts_that_do_not_fit_make_the_response_malformed_not_a_crash(demo, worker, llm, provider, tokens):
    turn = {"content": "Refunded.", "usage": {"input_tokens": tokens, "output_tokens": 5}}
    server, agent = llm(provider, [turn] * (settings.TOLLGATE["MAX_REPAIR_TURNS"] + 1))
    run = start_run(agent=agent, user=demo["requester"], input="Refund order 123.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.failure_type) == ("failed", "invalid_model_output")
    assert set(run.steps.values_list("status", flat=True)) == {"failed"}
    assert run.input_tokens == 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("character", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_a_provider_error_quoting_unstorable_characters_fails_the_run_cleanly(demo, worker, llm, provider, character):
    server, agent = llm(provider, [{"status": 400, "message": f"bad{character}request"}])
    run = start_run(agent=agent, user=demo["requester"], input="Refund order 123.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert run.error.endswith("API error 400 (BadRequestError): bad\ufffdrequest")  # the server's words, storable
    step = run.steps.get()
    assert step.error == run.error and step.response["error"] == {"status": 400, "message": "bad\ufffdrequest"}


# --- lone UTF-16 surrogates: no character, so no page, email or JSON in UTF-8 can hold one ------------

SURROGATE_CANCEL = {"name": "cancel_order", "arguments": '{"order_id": 125, "reason": "customer \\ud800 request"}'}


def _plain_agent(agent: Agent, **fields) -> None:
    """Make the replay agent complete on any final answer (``default`` check), with ``fields`` changed too."""
    for name, value in {"completion_check": "default", **fields}.items():
        setattr(agent, name, value)
    agent.save()


def _pages_answer(demo, run: Run) -> None:
    """Every approver's lists and the run's pages answer 200 (nothing stored breaks them)."""
    from django.test import Client
    from rest_framework.test import APIClient

    browser, api_client = Client(), APIClient()
    browser.force_login(demo["approver"])
    api_client.force_authenticate(demo["approver"])
    for path in ("/inbox/", f"/runs/{run.pk}/"):
        response = browser.get(path)
        assert response.status_code == 200, path
        response.content.decode("utf-8")
    for path in ("/api/interrupts/", "/api/interrupts/?status=pending", f"/api/runs/{run.pk}/tool-calls/"):
        assert api_client.get(path).status_code == 200, path


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("where", ["escaped", "decoded"])
def test_a_lone_surrogate_in_tool_arguments_is_an_invalid_call_and_the_inbox_stays_up(
        demo, worker, llm, provider, where):
    # "escaped": the arguments' JSON text holds \ud800; "decoded": the character itself, as an SDK hands it over
    raw = SURROGATE_CANCEL["arguments"] if where == "escaped" else '{"order_id": 125, "reason": "a \ud800 b"}'
    server, agent = llm(provider, [{"tool_calls": [{**SURROGATE_CANCEL, "arguments": raw}]}, {"content": "Sorry."}])
    _plain_agent(agent, tools=["query_order", "cancel_order"])
    run = start_run(agent=agent, user=demo["requester"], input="Cancel order 125.")
    worker.drain()
    run.refresh_from_db()

    call = run.tool_calls.get()
    assert call.status == "invalid" and "lone surrogate" in call.error
    assert call.raw_arguments.encode("utf-8")  # stored as text that can be encoded (the escape, not the char)
    assert run.interrupts.count() == 0 and run.status == "completed"
    told = [json.loads(c) for c in run.messages.filter(role="tool").values_list("content", flat=True)]
    assert told[0]["status"] == "invalid" and "lone surrogate" in told[0]["error"]
    _pages_answer(demo, run)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_lone_surrogate_in_the_answer_text_is_refused_and_told_to_the_model(demo, worker, llm, provider):
    server, agent = llm(provider, [{"content": "Cancelled \ud800 order 125."}, {"content": "Done."}])
    _plain_agent(agent)
    run = start_run(agent=agent, user=demo["requester"], input="Cancel order 125.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.final_output) == ("completed", "Done.")
    assert not run.messages.filter(content__contains="Cancelled").exists()
    repair = json.dumps(server.requests[1]["body"])
    assert "lone surrogate" in repair
    _pages_answer(demo, run)


@pytest.mark.parametrize("side_effect", [False, True])
def test_a_tool_result_with_a_lone_surrogate_is_not_stored(demo, worker, monkeypatch, side_effect):
    import dataclasses

    from tools import registry

    lookup = registry.get_tool("fake_lookup")
    monkeypatch.setitem(registry._TOOLS, "fake_lookup", dataclasses.replace(
        lookup, side_effect=side_effect, approval="never", handler=lambda ctx, args: {"note": "x \ud800 y"}))
    agent = create_agent(slug="surrogate-result", name="s", tools=["fake_lookup"], model={
        "provider": "scripted", "turns": [{"tool_calls": [{"name": "fake_lookup", "arguments": {"key": "a"}}]},
                                          {"content": "Looked."}]})
    run = start_run(agent=agent, user=demo["requester"], input="look")
    worker.drain()

    call = run.tool_calls.get()
    assert call.status == ("unknown" if side_effect else "failed")
    assert call.result is None and "cannot be stored" in call.error


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_answer_over_the_text_limit_is_refused_told_to_the_model_and_never_stored(demo, worker, llm, provider,
                                                                                     settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_MODEL_TEXT_CHARS": 5_000}
    server, agent = llm(provider, [{"content": "spam " * 2_000}, {"content": "Done."}])
    _plain_agent(agent)
    run = start_run(agent=agent, user=demo["requester"], input="Say something short.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.final_output) == ("completed", "Done.")
    assert not run.messages.filter(content__contains="spam spam").exists()
    assert "over the limit of 5000" in json.dumps(server.requests[1]["body"])
    assert any("over the limit" in (step.error or "") for step in run.steps.all())  # the run says so too
    _pages_answer(demo, run)


@pytest.mark.parametrize("raw", ['{"order_id": 125, "reason": "' + "x" * 20_000 + '"}',
                                 "[" * 3_000 + "]" * 3_000],
                         ids=["too-long", "3000-deep"])
def test_arguments_too_long_or_too_deep_are_an_invalid_call_and_the_pages_stay_up(demo, worker, settings, raw):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_MODEL_TEXT_CHARS": 10_000}
    agent = create_agent(slug="wild-arguments", name="w", tools=["query_order", "cancel_order"],
                         completion_check="default", model={"provider": "scripted", "turns": [
                             {"tool_calls": [{"name": "cancel_order", "arguments": raw}]}, {"content": "Sorry."}]})
    run = start_run(agent=agent, user=demo["requester"], input="Cancel order 125.")
    worker.drain()
    run.refresh_from_db()

    call = run.tool_calls.get()
    assert call.status == "invalid" and len(call.raw_arguments) <= 10_000
    assert run.status == "completed"
    told = json.loads(run.messages.filter(role="tool").values_list("content", flat=True).get())
    assert told["status"] == "invalid"
    _pages_answer(demo, run)


def test_a_long_text_stored_before_the_limit_is_shown_cut_on_the_run_page(demo, worker, client):
    agent = create_agent(slug="old-long", name="o", tools=[], completion_check="default",
                         model={"provider": "scripted", "turns": [{"content": "Done."}]})
    run = start_run(agent=agent, user=demo["requester"], input="Go.")
    worker.drain()
    run.messages.filter(role="assistant").update(content="y" * 3_000_000)  # as stored before the limit existed

    client.force_login(demo["requester"])
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    assert len(page.content) < 200_000 and "more characters" in page.content.decode()
