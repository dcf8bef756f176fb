"""The context builder trims what the model sees, never the stored history."""

import json

import pytest

from runs.engine.context import build_context, estimate_tokens, trim_history
from runs.models import Agent, Message, Run, Session
from runs.providers.anthropic_provider import to_anthropic_messages
from runs.transitions import apply
from runs.engine.lifecycle import begin_run, start_run
from tests.support.durability import lookup_agent
from tests.support.provider import TRANSFER_5, core_llm  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
WINDOW = 3000


def _snapshot(session) -> list[tuple]:
    return list(Message.objects.filter(session=session).order_by("id")
                .values_list("id", "role", "content", "tool_calls", "tool_call_id"))


def _long_session(agent, user, turns: int = 200) -> Session:
    """A session whose earlier (failed) run holds ``turns`` turns: question, tool call, result, answer."""
    session = Session.objects.create(owner=user, agent=agent, title="long")
    old = Run.objects.create(session=session, agent=agent, requested_by=user, input="old")
    rows = []
    for i in range(turns):
        call_id = f"call_old_{i}"
        rows += [
            Message(session=session, run=old, role="user", content=f"Question {i}: what about order {100 + i % 30}?"),
            Message(session=session, run=old, role="assistant", content="",
                    tool_calls=[{"id": call_id, "name": "query_order", "arguments": json.dumps({"order_id": 100 + i % 30})}]),
            Message(session=session, run=old, role="tool", tool_call_id=call_id,
                    content=json.dumps({"status": "succeeded", "result": {"order_id": 100 + i % 30, "total": "35.00"}})),
            Message(session=session, run=old, role="assistant", content=f"Order {100 + i % 30} totals 35.00. " * 3),
        ]
    # A call whose run was cancelled while it awaited approval: no result was ever stored.
    rows.append(Message(session=session, run=old, role="assistant", content="",
                        tool_calls=[{"id": "call_dangling", "name": "refund", "arguments": "{}"}]))
    Message.objects.bulk_create(rows)
    apply(old.fail, actor="test", failure_type="internal_error", error="history fixture")
    return session


def _assert_well_formed(messages: list[dict]) -> None:
    """Every tool call is directly followed by its results; no result lacks its call."""
    pending: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in pending, f"orphan tool result {message['tool_call_id']}"
            pending.remove(message["tool_call_id"])
            continue
        assert not pending, f"tool calls without results: {pending}"
        pending = [c["id"] for c in message.get("tool_calls") or []]
    assert not pending


def test_200_turn_session_is_trimmed_in_context_only(idle_worker, people, core_llm):
    server, agent = core_llm("openai", [{"tool_calls": [TRANSFER_5]}, {"content": "Sent 5 to acme."}],
                             context_window=WINDOW, max_output_tokens=200)
    session = _long_session(agent, people["requester"])
    before = _snapshot(session)
    assert len(before) == 801

    run = start_run(agent=agent, user=people["requester"], input="Now send 5 to acme.", session=session)
    assert begin_run(run, actor="test")  # what the worker does first: the input joins the history
    context = build_context(run, list(Message.objects.filter(session=session).order_by("id")))  # as Known reads it
    assert context.estimated_tokens <= WINDOW - 200
    assert context.omitted > 600
    _assert_well_formed(context.messages)
    assert context.messages[0] == {"role": "system", "content": f"{context.omitted} earlier messages were omitted to "
                                                                "fit the context window."}
    assert context.messages[-1] == {"role": "user", "content": "Now send 5 to acme."}
    assert any(m.get("tool_call_id") == "call_dangling" and json.loads(m["content"])["status"] == "missing"
               for m in context.messages)
    anthropic = to_anthropic_messages(context.messages)
    assert [m["role"] for m in anthropic] == ["user", "assistant"] * (len(anthropic) // 2) + ["user"] * (len(anthropic) % 2)

    idle_worker.worker.start()  # only now: the worker must not begin the run while the test does
    idle_worker.drain()
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("completed", "achieved")
    after = _snapshot(session)
    assert after[:len(before)] == before, "stored history unchanged"
    assert [row[1] for row in after[len(before):]] == ["user", "assistant", "tool", "assistant"]
    for body in server.bodies():
        sent = body["messages"]
        chars = sum(len(m.get("content") or "") + sum(len(c["function"]["name"] + c["function"]["arguments"])
                                                       for c in m.get("tool_calls") or []) for m in sent)
        assert chars / 4 + 4 * len(sent) + len(json.dumps(body["tools"])) / 4 < WINDOW
        assert "Now send 5 to acme." in [m.get("content") for m in sent]
        assert sent[0]["role"] == "system" and sent[0]["content"] == agent.instructions
    step = run.steps.order_by("index").first()
    assert step.request["omitted_messages"] == context.omitted


def test_the_current_runs_task_stays_when_its_own_turns_overflow():
    task = {"role": "user", "content": "the task"}
    history = [{"role": "user", "content": "old " * 400}, task]
    for i in range(50):
        history += [{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "name": "t", "arguments": "{}"}]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": "result " * 20}]
    original = json.dumps(history)
    trimmed, omitted = trim_history(history, budget_tokens=400, pinned_index=1)
    assert json.dumps(history) == original, "the input is not modified"
    assert trimmed[0]["content"] == "1 earlier message was omitted to fit the context window."
    assert trimmed[1] is task
    assert trimmed[2]["content"].endswith("messages were omitted to fit the context window.")
    assert omitted == 1 + int(trimmed[2]["content"].split()[0])
    _assert_well_formed([m for m in trimmed if m["role"] != "system"])
    assert sum(estimate_tokens(m) for m in trimmed if m["role"] != "system") <= 400


def test_orphan_tool_results_are_left_out_of_the_context():
    history = [{"role": "user", "content": "hi"},
               {"role": "tool", "tool_call_id": "nobody", "content": "{}"},
               {"role": "assistant", "content": "hello"}]
    trimmed, omitted = trim_history(history, budget_tokens=10_000)
    assert trimmed == [history[0], history[2]] and omitted == 0


def test_anthropic_wire_merges_roles_and_puts_tool_results_first():
    wire = to_anthropic_messages([
        {"role": "system", "content": "[note] 3 earlier messages were omitted"},
        {"role": "user", "content": "refund please"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "a", "name": "query_order", "arguments": '{"order_id": 1}'},
            {"id": "b", "name": "refund", "arguments": '{"order_id": 1, "amo'}]},
        {"role": "tool", "tool_call_id": "a", "content": '{"status": "succeeded", "result": {}}'},
        {"role": "tool", "tool_call_id": "b", "content": '{"status": "invalid", "error": "cut off"}'},
        {"role": "system", "content": "The task is not complete."},
        {"role": "assistant", "content": ""},
    ])
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert [b["type"] for b in wire[0]["content"]] == ["text", "text"]
    assert wire[1]["content"][2] == {"type": "tool_use", "id": "b", "name": "refund", "input": {}}
    assert [(b["type"], b.get("is_error", False)) for b in wire[2]["content"]] == [
        ("tool_result", False), ("tool_result", True), ("text", False)]


def test_agent_without_context_window_uses_the_setting(db, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "CONTEXT_MAX_TOKENS": 123_456}
    from runs.engine.context import window_tokens

    assert window_tokens(Agent.objects.get(pk=lookup_agent().pk).model) == 123_456
    assert window_tokens({"context_window": 8000}) == 8000


def test_a_call_id_reused_before_its_result_gets_a_synthetic_result():
    call = {"id": "call_0", "name": "query_order", "arguments": "{}"}
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "system", "content": "The task is not complete."},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_0", "content": "{}"}]
    trimmed, _ = trim_history(history, budget_tokens=10_000)
    _assert_well_formed(trimmed)
    assert [m["role"] for m in trimmed] == ["user", "assistant", "tool", "system", "assistant", "tool"]
    assert trimmed[-1] is history[-1]
