"""Helpers for the provider tests: a replay server per test, agents that use it, runs.

``llm`` is a fixture: ``llm(provider, script, **model_config)`` starts a
``ReplayServer`` and returns ``(server, agent)`` — an agent of the demo
refund shape (tools ``query_order`` and ``refund``, completion check
``refund``) whose model config points at the server with the key in
``TEST_KEY``; ``core_llm`` is the same without the demo (the tests' own
tools ``fake_lookup`` and ``fake_transfer``, check ``fake_transfer``). The server is an endpoint profile added to
``TOLLGATE["MODEL_ENDPOINTS"]`` for the test (``server.endpoint`` names
it), as an operator would configure it. Import it into a test module to
use it.
"""

import json
import uuid

import pytest

from approvals.services import decide_interrupt
from runs.models import Agent, Run
from runs.engine.lifecycle import start_run
from tests.support.fakes.llm_server import ReplayServer

MODELS = {"openai": "gpt-test", "anthropic": "claude-test"}
QUERY = {"name": "query_order", "arguments": json.dumps({"order_id": 123})}
REFUND_80 = {"name": "refund", "arguments": json.dumps({"order_id": 123, "amount": 80})}
REFUND_30 = {"name": "refund", "arguments": json.dumps({"order_id": 123, "amount": 30})}
# The tests' own tools (``core_llm``): 5 needs no approval, 80 does.
LOOKUP_ACME = {"name": "fake_lookup", "arguments": json.dumps({"key": "acme"})}
TRANSFER_5 = {"name": "fake_transfer", "arguments": json.dumps({"account": "acme", "amount": 5})}
TRANSFER_80 = {"name": "fake_transfer", "arguments": json.dumps({"account": "acme", "amount": 80})}


def model_config(settings, server: ReplayServer, name: str, **model) -> dict:
    """Add ``server`` as the endpoint profile ``name`` (key in ``TEST_KEY``) and return a model config
    that uses it (streamed unless ``model`` says otherwise); ``server.endpoint`` becomes ``name``."""
    server.endpoint = name
    settings.TOLLGATE = {**settings.TOLLGATE, "MODEL_ENDPOINTS": {
        **settings.TOLLGATE["MODEL_ENDPOINTS"],
        name: {"provider": server.provider, "base_url": server.base_url, "api_key_env": "TEST_KEY"}}}
    return {"provider": server.provider, "model": MODELS[server.provider], "endpoint": name, "stream": True,
            **model}


def _replay_agents(monkeypatch, settings, name: str, instructions: str, tools: list[str], check: str):
    """The maker behind ``llm`` and ``core_llm`` (agents with ``tools`` and completion check ``check``), and
    a function that stops every server it started."""
    servers = []
    monkeypatch.setenv("TEST_KEY", "x")

    def make(provider: str, script: list[dict], agent_fields: dict | None = None, **model):
        server = ReplayServer(provider, script).start()
        servers.append(server)
        config = model_config(settings, server, f"replay-{len(servers)}", **model)
        agent = Agent.objects.create(
            slug=f"{provider}-{uuid.uuid4().hex[:8]}", name=f"{provider} {name}", instructions=instructions,
            model=config, tools=tools, completion_check=check, **(agent_fields or {}))
        return server, agent

    def stop():
        for server in servers:
            server.stop()

    return make, stop


@pytest.fixture
def llm(monkeypatch, demo, settings):
    make, stop = _replay_agents(monkeypatch, settings, "refund",
                                "Help the customer get a refund. Check the order first.",
                                ["query_order", "refund"], "refund")
    yield make
    stop()


@pytest.fixture
def core_llm(monkeypatch, people, settings):
    """``llm`` without the demo: agents with the tests' own tools (``fake_lookup``, ``fake_transfer``) and the
    completion check ``fake_transfer``; users from ``people``."""
    make, stop = _replay_agents(monkeypatch, settings, "transfer",
                                "Make the transfer asked for. Look the account up first.",
                                ["fake_lookup", "fake_transfer"], "fake_transfer")
    yield make
    stop()


def run_to_rest(worker, agent, user, text: str = "Please refund 80 on order 123.", **kwargs) -> Run:
    """Start a run and let the worker take it as far as it goes; the run, fresh."""
    run = start_run(agent=agent, user=user, input=text, **kwargs)
    worker.drain()
    run.refresh_from_db()
    return run


def decide(worker, run: Run, user, decision: str, comment: str = "") -> Run:
    """Decide the run's only pending approval, let the worker continue; the run, fresh."""
    interrupt = run.interrupts.get(status="pending")
    decide_interrupt(interrupt=interrupt, user=user, decision=decision, comment=comment)
    worker.drain()
    run.refresh_from_db()
    return run


def tool_results_sent(provider: str, body: dict) -> dict[str, str]:
    """``{call id: result text}`` of every tool result in a request body the server received."""
    if provider == "openai":
        return {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
    return {block["tool_use_id"]: block["content"]
            for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], list)
            for block in m["content"] if block["type"] == "tool_result"}


def tool_calls_sent(provider: str, body: dict) -> list[str]:
    """Ids of every tool call (assistant side) in a request body, in order."""
    if provider == "openai":
        return [c["id"] for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    return [b["id"] for m in body["messages"] if m["role"] == "assistant" for b in m["content"]
            if b["type"] == "tool_use"]


def events(run: Run, type: str | None = None) -> list:
    qs = run.events.order_by("seq")
    return list(qs.filter(type=type) if type else qs)
