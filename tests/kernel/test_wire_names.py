"""Tool names a model API refuses (an MCP server's ``server.tool``) go out in a form it takes and come back as
registered: unit rules, and a run against a strict OpenAI-compatible server over real HTTP."""

import json

from runs.engine.wire_names import ACCEPTED, on_the_wire, real_names, wire_names
from runs.models import Agent, RunStatus
from tests.support.fakes.strict_openai import StrictOpenAIServer
from tests.support.provider import model_config
from tools import registry
from tools.models import ToolCall
from tools.registry import Tool

LOOKUP = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"],
          "additionalProperties": False}


def test_only_refused_names_change_and_every_form_is_accepted_and_distinct():
    names = ["refund", "crm.lookup", "crm__lookup", "files.read file", "m." + "x" * 80, "a.b", "a_b"]
    forms = wire_names(names)
    assert set(forms) == {"crm.lookup", "files.read file", "m." + "x" * 80, "a.b"}
    assert forms["files.read file"] == "files__read_file" and forms["a.b"] == "a__b"
    assert forms["crm.lookup"] not in ("crm__lookup",) and forms["crm.lookup"].startswith("crm__lookup_")
    sent = [forms.get(name, name) for name in names]
    assert all(ACCEPTED.fullmatch(form) for form in sent) and len(set(sent)) == len(names)
    assert wire_names(reversed(names)) == forms  # the same agent's tools: the same forms every time


def test_the_history_and_the_answer_are_translated_both_ways():
    tools = [{"name": "crm.lookup", "description": "", "parameters": LOOKUP}]
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "crm.lookup",
                                                                     "arguments": "{}"}]}]
    sent_tools, sent_messages, back = on_the_wire(tools, messages)
    assert sent_tools[0]["name"] == sent_messages[1]["tool_calls"][0]["name"] == "crm__lookup"
    assert messages[1]["tool_calls"][0]["name"] == "crm.lookup" and tools[0]["name"] == "crm.lookup"  # copies
    calls = [{"id": "c2", "name": "crm__lookup"}, {"id": "c3", "name": "nothing_known"}, {"id": "c4", "name": [1]}]
    real_names(calls, back)
    assert [call["name"] for call in calls] == ["crm.lookup", "nothing_known", [1]]


def test_a_run_calls_a_dotted_tool_through_a_strict_openai_server(people, worker, settings, monkeypatch):
    monkeypatch.setenv("TEST_KEY", "x")
    monkeypatch.setitem(registry._TOOLS, "crm.lookup", Tool(
        name="crm.lookup", description="Look a customer up.", parameters=LOOKUP,
        handler=lambda ctx, args: {"customer": args["id"], "tier": "gold"}))
    server = StrictOpenAIServer([
        {"tool_calls": [{"name": "crm__lookup", "arguments": json.dumps({"id": "C-7"})}]},
        {"content": "C-7 is a gold customer."}]).start()
    try:
        agent = Agent.objects.create(slug="crm-agent", name="CRM", instructions="Look customers up.",
                                     model=model_config(settings, server, "strict", stream=False),
                                     tools=["crm.lookup"])
        from runs.engine.lifecycle import start_run
        run = start_run(agent=agent, user=people["requester"], input="Who is C-7?")
        worker.drain()
        run.refresh_from_db()
    finally:
        server.stop()

    assert server.violations == []
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    call = ToolCall.objects.get(run=run)
    assert (call.name, call.status, call.result) == ("crm.lookup", "succeeded", {"customer": "C-7", "tier": "gold"})
    first, second = (request["body"] for request in server.requests)
    assert [tool["function"]["name"] for tool in first["tools"]] == ["crm__lookup"]
    assistant = next(message for message in second["messages"] if message.get("tool_calls"))
    assert assistant["tool_calls"][0]["function"]["name"] == "crm__lookup"  # the history keeps the form sent


def test_names_in_the_history_of_tools_not_offered_now_go_out_in_a_form_the_api_takes():
    """The session's history may hold calls of tools the agent does not offer now (an earlier version's, an MCP
    tool held for an operator): they go out in an accepted form too, and no form of an offered tool takes
    a name the history already gives another tool."""
    tools = [{"name": "a.b", "description": "", "parameters": LOOKUP}]
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "name": "crm.lookup", "arguments": "{}"}, {"id": "c2", "name": "a__b", "arguments": "{}"}]}]
    sent_tools, sent_messages, back = on_the_wire(tools, messages)
    sent_calls = [call["name"] for call in sent_messages[0]["tool_calls"]]
    assert all(ACCEPTED.fullmatch(name) for name in sent_calls)
    assert sent_calls[1] == "a__b" and sent_tools[0]["name"] not in sent_calls  # a__b was another tool
    assert back[sent_tools[0]["name"]] == "a.b"


def test_a_session_goes_on_with_a_version_that_no_longer_offers_the_dotted_tool(people, worker, settings, monkeypatch):
    """Run 1 calls ``crm.lookup``; the agent's next version drops it; run 2 of the session sends the history
    with that call again, which the strict server takes only in an accepted form."""
    from runs.engine.agents import update_agent
    from runs.engine.lifecycle import start_run

    monkeypatch.setenv("TEST_KEY", "x")
    monkeypatch.setitem(registry._TOOLS, "crm.lookup", Tool(
        name="crm.lookup", description="Look a customer up.", parameters=LOOKUP,
        handler=lambda ctx, args: {"customer": args["id"], "tier": "gold"}))
    server = StrictOpenAIServer([
        {"tool_calls": [{"name": "crm__lookup", "arguments": json.dumps({"id": "C-7"})}]},
        {"content": "C-7 is a gold customer."},
        {"content": "Still gold."}]).start()
    try:
        agent = Agent.objects.create(slug="crm-agent", name="CRM", instructions="Look customers up.",
                                     model=model_config(settings, server, "strict", stream=False),
                                     tools=["crm.lookup"])
        first = start_run(agent=agent, user=people["requester"], input="Who is C-7?")
        worker.drain()
        update_agent(agent=agent, tools=[], user=people["admin"])
        agent.refresh_from_db()  # version 1, no longer current
        second = start_run(agent=agent, user=people["requester"], input="And now?", session=first.session)
        worker.drain()
        second.refresh_from_db()
    finally:
        server.stop()

    assert server.violations == []
    assert (second.status, second.outcome, second.final_output) == (RunStatus.COMPLETED, "achieved", "Still gold.")
    assert second.agent.version == 2
