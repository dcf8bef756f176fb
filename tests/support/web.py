"""Runs of the tests' own tools (``tests.support.core``) for the page tests (tests/web, tests/browser).

``users`` is ``{username: User}`` with ``requester`` and ``approver`` (the ``people`` fixture).

* ``waiting_transfer(users, worker)``: a run of ``asking_agent`` (look acme
  up, transfer 80 to it) drained until it waits for the transfer's approval;
* ``finished_transfer(users, worker, decision="approved", ...)``: such a run
  with its item decided by the approver, drained to its end (completed);
* ``core_runs(users, worker)``: one run of each of ``lookup_agent``,
  ``refused_agent`` and ``asking_agent``, drained: rows in several states;
* the fixture ``unanswered_transfer``: a tool whose calls end with their
  outcome unknown (import it into a test module to use it);
  ``unanswered_agent()``: an agent that calls it once.
"""

import pytest

from approvals.services import decide_interrupt
from runs.engine.lifecycle import start_run
from runs.models import Agent, Run, RunStatus, WaitingReason
from tests.support.core import asking_agent, refused_agent
from tests.support.durability import lookup_agent, make_agent
from tools import registry
from tools.registry import Reconciliation, Tool, ToolUnavailable


def waiting_transfer(users, worker, text: str = "Send 80 to acme.") -> Run:
    """The requester's run of ``asking_agent()``, drained until it waits for approval of its transfer."""
    run = start_run(agent=asking_agent(), user=users["requester"], input=text)
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.APPROVAL)
    return run


def finished_transfer(users, worker, decision: str = "approved", **decide) -> Run:
    """``waiting_transfer``'s run, its item decided by the approver (``decide``: comment, edited_arguments),
    drained until it completes."""
    run = waiting_transfer(users, worker)
    decide_interrupt(interrupt=run.interrupts.get(), user=users["approver"], decision=decision, **decide)
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    return run


def core_runs(users, worker) -> None:
    """One run of a lookup agent (completes), of ``refused_agent`` (completes not achieved, its call denied) and
    of ``asking_agent`` (waits for approval), drained: rows in several states in every table."""
    lookup = Agent.objects.filter(slug="lookup").first() or lookup_agent()
    for agent in (lookup, refused_agent(), asking_agent()):
        start_run(agent=agent, user=users["requester"], input=f"please, {agent.name}")
    worker.drain()


@pytest.fixture
def unanswered_transfer():
    """The tool ``unanswered_transfer`` (changes things, idempotent), registered for the test only: its bank answers
    every call with an error before committing anything, and its reconcile hook finds nothing under any key."""

    def unavailable(ctx, args):
        raise ToolUnavailable("bank error 503: try again later")

    tool = registry.register(Tool(
        name="unanswered_transfer", description="Transfer through a bank that errs (a test tool).", handler=unavailable,
        side_effect=True, idempotent=True, target_key="account", backoff_s=0.0,
        reconcile=lambda key: Reconciliation("not_found"),
        parameters={"type": "object", "properties": {"account": {"type": "string"}, "amount": {"type": "number"}},
                    "required": ["account", "amount"]}))
    yield tool
    registry._TOOLS.pop(tool.name)


def unanswered_agent():
    """The scripted agent ``transfer-30`` (made on first use): one call of ``unanswered_transfer`` (30 to acme,
    no approval asked), then "Sent 30."; needs the ``unanswered_transfer`` fixture."""
    return Agent.objects.filter(slug="transfer-30").first() or make_agent("transfer-30", [
        {"tool_calls": [{"name": "unanswered_transfer", "arguments": {"account": "acme", "amount": 30}}]},
        {"content": "Sent 30."}], tools=["unanswered_transfer"])
