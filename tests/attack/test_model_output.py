"""Untrusted model output is refused at the door, never a database error (issue 9, item 5).

A model that keeps sending ``NaN``, ``Infinity``, ``1e309``, NUL
characters or over-long ids gets ``invalid`` results and the run ends
``failed/invalid_model_output`` once the repair turns are spent, on either
database, with no step discarded. Header fields of an email are single
lines (``header-text``, here the subject of the test tool ``fake_notice``),
and a header Django refuses is a failed call, not an unknown one.
The argument parser on its own is tests/unit/test_model_arguments.py.
"""

import json

import pytest
from django.conf import settings

from runs.engine.agents import create_agent
from runs.models import Agent, Run
from runs.engine.lifecycle import start_run
from tests.support.fake_tools import FAKE_NOTICE
from tests.support.provider import TRANSFER_5, core_llm  # noqa: F401
from tools import registry


pytestmark = pytest.mark.django_db(transaction=True)
LONG_ID = "x" * 200


def _repeating_agent(slug: str, call: dict) -> Agent:
    turns = [{"tool_calls": [call]}] * (settings.TOLLGATE["MAX_REPAIR_TURNS"] + 2)
    return create_agent(slug=slug, name=slug, model={"provider": "scripted", "turns": turns},
                        tools=["fake_lookup", "fake_transfer"], completion_check="fake_transfer")


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
    "nan": '{"account": "acme", "amount": NaN}',
    "infinity": '{"account": "acme", "amount": Infinity}',
    "minus-infinity": '{"account": "acme", "amount": -Infinity}',
    "overflow": '{"account": "acme", "amount": 1e309}',
    "nul": '{"account": "acme", "amount": 30, "memo": "\\u0000"}',
}
SEND_30 = json.dumps({"account": "acme", "amount": 30})


@pytest.mark.parametrize("kind", BAD_ARGUMENTS)
def test_scripted_model_repeating_unsafe_arguments_ends_invalid_model_output(people, worker, kind):
    agent = _repeating_agent(f"bad-{kind}", {"name": "fake_transfer", "arguments": BAD_ARGUMENTS[kind]})
    run = start_run(agent=agent, user=people["requester"], input="Send 30 to acme.")
    worker.drain()

    _assert_refused_until_the_run_fails(run)
    assert run.interrupts.count() == 0


def test_scripted_model_repeating_a_200_character_call_id_ends_invalid_model_output(people, worker):
    call = {"id": LONG_ID, "name": "fake_transfer", "arguments": SEND_30}
    agent = _repeating_agent("long-id", call)
    run = start_run(agent=agent, user=people["requester"], input="Send 30 to acme.")
    worker.drain()

    _assert_refused_until_the_run_fails(run)
    first = run.tool_calls.order_by("id").first()
    assert len(first.provider_call_id) <= 100 and "id" in first.error
    proposed = run.events.filter(type="tool_call", reason="proposed").first()
    assert proposed.payload["original_id"] == LONG_ID


@pytest.mark.parametrize("call", [
    {"id": "call\x00one", "name": "fake_transfer", "arguments": SEND_30},
    {"name": "fake_transfer\x00", "arguments": SEND_30},
    {"name": "f" * 300, "arguments": SEND_30},
    {"name": "fake_transfer", "arguments": '{"account": "acme", "amount": 3\x000}'},
], ids=["nul-in-id", "nul-in-name", "long-name", "raw-nul"])
def test_a_server_sending_nul_or_long_names_gets_invalid_calls_until_the_run_fails(people, worker, core_llm, call):
    turns = [{"content": "Working\x00.", "tool_calls": [call]}] * (settings.TOLLGATE["MAX_REPAIR_TURNS"] + 1)
    server, agent = core_llm("openai", turns)
    run = start_run(agent=agent, user=people["requester"], input="Send 30 to acme.")
    worker.drain()

    _assert_refused_until_the_run_fails(run)
    assistant = run.messages.filter(role="assistant").first()
    assert assistant.content == "Working."


def test_nul_in_the_final_answer_is_removed_not_a_crash(people, worker, core_llm):
    server, agent = core_llm("anthropic", [{"tool_calls": [TRANSFER_5]}, {"content": "Sent\x00 5."}])
    run = start_run(agent=agent, user=people["requester"], input="Send 5 to acme.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.outcome, run.final_output) == ("completed", "achieved", "Sent 5.")


@pytest.fixture
def notice_tool(monkeypatch):
    """``FAKE_NOTICE`` (a message with a ``header-text`` subject) in the registry for this test."""
    monkeypatch.setitem(registry._TOOLS, FAKE_NOTICE.name, FAKE_NOTICE)
    return FAKE_NOTICE


def _notice_agent(subject: str) -> Agent:
    look = {"name": "fake_lookup", "arguments": {"key": "acme"}}
    send = {"name": "fake_notice", "arguments": {"to": "customer@example.com", "subject": subject, "body": "Hi."}}
    return create_agent(slug="header-injection", name="Header injection", tools=["fake_lookup", "fake_notice"],
                        model={"provider": "scripted", "turns": [{"tool_calls": [look]}, {"tool_calls": [send]},
                                                                 {"content": "Sent."}]})


@pytest.mark.parametrize("subject", ["Your contract\r\nBcc: all@example.com", "Your contract\nX-Evil: 1",
                                     # str.splitlines (and a mail library folding a header) breaks at these too
                                     "Your\vcontract", "Your\fcontract", "Your\x1ccontract", "Your\u2028contract",
                                     "Your\x85contract"])
def test_an_email_subject_with_a_line_break_is_an_invalid_call_never_unknown(people, worker, notice_tool, subject):
    run = start_run(agent=_notice_agent(subject), user=people["requester"], input="Send the notice.")
    worker.drain()
    run.refresh_from_db()

    send = run.tool_calls.get(name="fake_notice")
    assert send.status == "invalid" and "header-text" in send.error
    assert not run.tool_calls.filter(status="unknown").exists()
    assert run.interrupts.count() == 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("tokens", [-5, 10**12])
def test_token_counts_that_do_not_fit_make_the_response_malformed_not_a_crash(people, worker, core_llm, provider,
                                                                              tokens):
    turn = {"content": "Sent.", "usage": {"input_tokens": tokens, "output_tokens": 5}}
    server, agent = core_llm(provider, [turn] * (settings.TOLLGATE["MAX_REPAIR_TURNS"] + 1))
    run = start_run(agent=agent, user=people["requester"], input="Send 30 to acme.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.failure_type) == ("failed", "invalid_model_output")
    assert set(run.steps.values_list("status", flat=True)) == {"failed"}
    assert run.input_tokens == 0


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("character", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_a_provider_error_quoting_unstorable_characters_fails_the_run_cleanly(people, worker, core_llm, provider,
                                                                              character):
    server, agent = core_llm(provider, [{"status": 400, "message": f"bad{character}request"}])
    run = start_run(agent=agent, user=people["requester"], input="Send 30 to acme.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert run.error.endswith("API error 400 (BadRequestError): bad\ufffdrequest")  # the server's words, storable
    step = run.steps.get()
    assert step.error == run.error and step.response["error"] == {"status": 400, "message": "bad\ufffdrequest"}


# --- lone UTF-16 surrogates: no character, so no page, email or JSON in UTF-8 can hold one ------------

SURROGATE_TRANSFER = {"name": "fake_transfer", "arguments": '{"account": "acme \\ud800 two", "amount": 5}'}


def _plain_agent(agent: Agent, **fields) -> None:
    """Make the replay agent complete on any final answer (``default`` check), with ``fields`` changed too."""
    for name, value in {"completion_check": "default", **fields}.items():
        setattr(agent, name, value)
    agent.save()


def _pages_answer(people, run: Run) -> None:
    """Every approver's lists and the run's pages answer 200 (nothing stored breaks them)."""
    from django.test import Client
    from rest_framework.test import APIClient

    browser, api_client = Client(), APIClient()
    browser.force_login(people["approver"])
    api_client.force_authenticate(people["approver"])
    for path in ("/inbox/", f"/runs/{run.pk}/"):
        response = browser.get(path)
        assert response.status_code == 200, path
        response.content.decode("utf-8")
    for path in ("/api/interrupts/", "/api/interrupts/?status=pending", f"/api/runs/{run.pk}/tool-calls/"):
        assert api_client.get(path).status_code == 200, path


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("where", ["escaped", "decoded"])
def test_a_lone_surrogate_in_tool_arguments_is_an_invalid_call_and_the_inbox_stays_up(
        people, worker, core_llm, provider, where):
    # "escaped": the arguments' JSON text holds \ud800; "decoded": the character itself, as an SDK hands it over
    raw = SURROGATE_TRANSFER["arguments"] if where == "escaped" else '{"account": "a \ud800 b", "amount": 5}'
    server, agent = core_llm(provider, [{"tool_calls": [{**SURROGATE_TRANSFER, "arguments": raw}]},
                                        {"content": "Sorry."}])
    _plain_agent(agent)
    run = start_run(agent=agent, user=people["requester"], input="Send 5 to acme.")
    worker.drain()
    run.refresh_from_db()

    call = run.tool_calls.get()
    assert call.status == "invalid" and "lone surrogate" in call.error
    assert call.raw_arguments.encode("utf-8")  # stored as text that can be encoded (the escape, not the char)
    assert run.interrupts.count() == 0 and run.status == "completed"
    told = [json.loads(c) for c in run.messages.filter(role="tool").values_list("content", flat=True)]
    assert told[0]["status"] == "invalid" and "lone surrogate" in told[0]["error"]
    _pages_answer(people, run)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_lone_surrogate_in_the_answer_text_is_refused_and_told_to_the_model(people, worker, core_llm, provider):
    server, agent = core_llm(provider, [{"content": "Transferred \ud800 5 to acme."}, {"content": "Done."}])
    _plain_agent(agent)
    run = start_run(agent=agent, user=people["requester"], input="Send 5 to acme.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.final_output) == ("completed", "Done.")
    assert not run.messages.filter(content__contains="Transferred").exists()
    repair = json.dumps(server.requests[1]["body"])
    assert "lone surrogate" in repair
    _pages_answer(people, run)


@pytest.mark.parametrize("side_effect", [False, True])
def test_a_tool_result_with_a_lone_surrogate_is_not_stored(people, worker, monkeypatch, side_effect):
    import dataclasses

    lookup = registry.get_tool("fake_lookup")
    monkeypatch.setitem(registry._TOOLS, "fake_lookup", dataclasses.replace(
        lookup, side_effect=side_effect, approval="never", handler=lambda ctx, args: {"note": "x \ud800 y"}))
    agent = create_agent(slug="surrogate-result", name="s", tools=["fake_lookup"], model={
        "provider": "scripted", "turns": [{"tool_calls": [{"name": "fake_lookup", "arguments": {"key": "a"}}]},
                                          {"content": "Looked."}]})
    run = start_run(agent=agent, user=people["requester"], input="look")
    worker.drain()

    call = run.tool_calls.get()
    assert call.status == ("unknown" if side_effect else "failed")
    assert call.result is None and "cannot be stored" in call.error


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_answer_over_the_text_limit_is_refused_told_to_the_model_and_never_stored(people, worker, core_llm,
                                                                                     provider, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_MODEL_TEXT_CHARS": 5_000}
    server, agent = core_llm(provider, [{"content": "spam " * 2_000}, {"content": "Done."}])
    _plain_agent(agent)
    run = start_run(agent=agent, user=people["requester"], input="Say something short.")
    worker.drain()
    run.refresh_from_db()

    assert (run.status, run.final_output) == ("completed", "Done.")
    assert not run.messages.filter(content__contains="spam spam").exists()
    assert "over the limit of 5000" in json.dumps(server.requests[1]["body"])
    assert any("over the limit" in (step.error or "") for step in run.steps.all())  # the run says so too
    _pages_answer(people, run)


@pytest.mark.parametrize("raw", ['{"account": "' + "x" * 20_000 + '", "amount": 5}',
                                 "[" * 3_000 + "]" * 3_000],
                         ids=["too-long", "3000-deep"])
def test_arguments_too_long_or_too_deep_are_an_invalid_call_and_the_pages_stay_up(people, worker, settings, raw):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_MODEL_TEXT_CHARS": 10_000}
    agent = create_agent(slug="wild-arguments", name="w", tools=["fake_lookup", "fake_transfer"],
                         completion_check="default", model={"provider": "scripted", "turns": [
                             {"tool_calls": [{"name": "fake_transfer", "arguments": raw}]}, {"content": "Sorry."}]})
    run = start_run(agent=agent, user=people["requester"], input="Send 5 to acme.")
    worker.drain()
    run.refresh_from_db()

    call = run.tool_calls.get()
    assert call.status == "invalid" and len(call.raw_arguments) <= 10_000
    assert run.status == "completed"
    told = json.loads(run.messages.filter(role="tool").values_list("content", flat=True).get())
    assert told["status"] == "invalid"
    _pages_answer(people, run)


def test_a_long_text_stored_before_the_limit_is_shown_cut_on_the_run_page(people, worker, client):
    agent = create_agent(slug="old-long", name="o", tools=[], completion_check="default",
                         model={"provider": "scripted", "turns": [{"content": "Done."}]})
    run = start_run(agent=agent, user=people["requester"], input="Go.")
    worker.drain()
    run.messages.filter(role="assistant").update(content="y" * 3_000_000)  # as stored before the limit existed

    client.force_login(people["requester"])
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    assert len(page.content) < 200_000 and "more characters" in page.content.decode()
