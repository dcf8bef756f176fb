"""Statements between an approval and its tool's start, capped (issue 13's latency target).

Two stretches of the path from "approve" to the transfer's ``ToolCall.started_at``:

* the decision: ``approvals.services.decide_interrupt`` on its own, and the
  whole request, over the REST API (``POST /api/interrupts/<id>/approve/``:
  token auth, the item's lookup, the decision, its commit hooks, the answer)
  and from the item's page (the form's POST: the session's user, the same);
* the worker's resume: taking the lease and advancing the run
  (``runs.engine.loop.advance``, what the engine does for an ``advance_run``
  message, here in the test's thread so its statements can be counted)
  until the transfer's handler is called (``running`` committed with its key).

And the decision's commit sends the worker's wake-up before the live push.

Only data statements are counted (SELECT, INSERT, UPDATE, DELETE, and
PostgreSQL's WITH and parenthesized UNION); savepoints are counted apart,
and a decision needs none (an error undoes all of it). The caps are what
each stretch costs today. Main before them: the decision 15 data statements
and 3 savepoints (with the user's permissions inside a subquery that
PostgreSQL planned anew every time: now read once per user object), the
request 21, the resume 14. The three transitions then logged their events
with a reservation each (the request 17). Then the decision 11 and the
request 12 (on SQLite; PostgreSQL's WITH writes the events with one
statement fewer), with the permissions in two reads, the decider checked
again with the item's lock by a SQL flag and "another item pending?" a
statement of its own.
"""

import dataclasses
import re

import dramatiq
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.urls import reverse

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.engine import loop
from runs import live
from runs.engine.lifecycle import start_run
from runs.models import Agent, RunStatus
from tests.support.core import transfer
from tools import registry
from tools.models import ToolCallStatus

DATA = re.compile(r"^[\s(]*(WITH|SELECT|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
SAVEPOINT = re.compile(r"^\s*SAVEPOINT\b", re.IGNORECASE)


def event_writes() -> int:
    """Statements that log a block's events with their reservation (``runs.services.append_events``): the
    run row with the seqs, then the events; one ``WITH`` on PostgreSQL, two statements on SQLite."""
    return 1 if connection.vendor == "postgresql" else 2


def riding_rows() -> int:
    """Statements that write the item's and the call's rows, kept by the block's ``EventBatch``: none of
    their own on PostgreSQL (they go in the events' ``WITH``), one each elsewhere."""
    return 0 if connection.vendor == "postgresql" else 2


# Data statements at most. The decision: the user's permissions (1, read once per user object),
# may they decide it (1), the run locked (1), the item locked with "another item pending?" (1), then
# the item's and the call's rows, their events and the run's own transition with one reservation
# (``EventBatch``), "any webhook subscriber?" (1). The decider is checked again in memory with the
# item's lock (``runs.access.may_decide``).
def decision_cap() -> int:
    return 5 + riding_rows() + event_writes()


# The request: token auth (1), the permissions (1), the item as the API shows it, with whether this
# user may decide it (1), then the decision as above without the permissions and without "may they
# decide it" (the lookup's flag answers: ``can_decide``). The form's POST: the session and its user
# (2) instead of the token, the rest the same.
def request_cap() -> int:
    return 3 + decision_cap() - 2


# The resume: the lease with its new token (1), the run (1), its calls and any step in flight
# (2), the transfer's precondition and idempotency key (2), ``running`` with its event and the
# run's phase (4), the look for an earlier result of the same key (1).
RESUME_CAP = 11


class Recorder:
    """SQL of every statement this thread's connection runs."""

    def __init__(self):
        self.sql: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        self.sql.append(sql)
        return execute(sql, params, many, context)

    def data(self, start: int = 0, stop: int | None = None) -> int:
        return sum(1 for sql in self.sql[start:stop] if DATA.match(sql))

    def savepoints(self) -> int:
        return sum(1 for sql in self.sql if SAVEPOINT.match(sql))


@pytest.fixture
def waiting_runs(idle_worker, people):
    """``make()`` -> a run of ``fake_transfer`` (60 to an account of its own) waiting for its approval."""
    numbers = iter(range(9101, 9200))

    def make():
        number = next(numbers)
        sending = {"tool_calls": [transfer(f"acct-{number}", 60)]}
        agent = Agent.objects.create(slug=f"latency-{number}", name="latency", tools=["fake_transfer"],
                                     completion_check="fake_transfer",
                                     model={"provider": "scripted", "turns": [sending, {"content": "Sent."}]})
        run = start_run(agent=agent, user=people["requester"], input=f"send 60 to acct-{number}")
        loop.advance(run.pk)
        run.refresh_from_db()
        assert (run.status, run.waiting_reason) == (RunStatus.WAITING, "approval")
        return run

    return make


def test_a_decision_stays_within_its_statement_cap_and_takes_no_savepoint(waiting_runs):
    run = waiting_runs()
    approver = get_user_model().objects.get(username="approver")  # fresh: its permissions are not read yet
    item = Interrupt.objects.get(run=run)
    recorder = Recorder()
    with connection.execute_wrapper(recorder):
        decide_interrupt(interrupt=item, user=approver, decision="approved")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert recorder.data() <= decision_cap(), "\n".join(recorder.sql)
    assert recorder.savepoints() == 0, "\n".join(recorder.sql)


def test_an_approval_request_stays_within_its_statement_cap(waiting_runs, api, people):
    run = waiting_runs()
    item = Interrupt.objects.get(run=run)
    client = api(people["approver"])  # its token exists before the request
    recorder = Recorder()
    with connection.execute_wrapper(recorder):
        response = client.post(f"/api/interrupts/{item.pk}/approve/", {"comment": "ok"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "resolved" and response.json()["can_decide"] is True
    assert recorder.data() <= request_cap(), "\n".join(recorder.sql)
    assert recorder.savepoints() == 0, "\n".join(recorder.sql)


def test_a_decision_from_the_items_page_stays_within_the_requests_statement_cap(waiting_runs, client, people):
    run = waiting_runs()
    item = Interrupt.objects.get(run=run)
    client.force_login(people["approver"])
    recorder = Recorder()
    with connection.execute_wrapper(recorder):
        response = client.post(reverse("inbox-item", args=[item.pk]), {"decision": "approved", "comment": "ok"})
    assert response.status_code == 302, response.content
    item.refresh_from_db()
    assert (item.status, item.decision, item.resolved_by) == ("resolved", "approved", people["approver"])
    assert recorder.data() <= 1 + request_cap(), "\n".join(recorder.sql)
    assert recorder.savepoints() == 0, "\n".join(recorder.sql)


def test_a_resumed_run_reaches_its_tool_within_the_statement_cap(waiting_runs, people, monkeypatch):
    run = waiting_runs()
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")
    recorder = Recorder()
    reached = []
    sending = registry.get_tool("fake_transfer")

    def handler(context, arguments):
        reached.append(len(recorder.sql))
        return sending.handler(context, arguments)

    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(sending, handler=handler))
    with connection.execute_wrapper(recorder):
        loop.advance(run.pk)
    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert run.tool_calls.get().status == ToolCallStatus.SUCCEEDED
    assert len(reached) == 1
    assert recorder.data(stop=reached[0]) <= RESUME_CAP, "\n".join(recorder.sql[:reached[0]])


def test_the_workers_wake_up_leaves_before_the_live_push(waiting_runs, people, monkeypatch):
    run = waiting_runs()
    item = Interrupt.objects.get(run=run)
    sent = []
    broker = dramatiq.get_broker()
    enqueue, send = broker.enqueue, live._send
    monkeypatch.setattr(broker, "enqueue", lambda message, **kw: sent.append("wake-up") or enqueue(message, **kw))
    monkeypatch.setattr(live, "_send", lambda sends: sent.append("live push") or send(sends))
    decide_interrupt(interrupt=item, user=people["approver"], decision="approved")
    assert sent[:2] == ["wake-up", "live push"], sent
