"""Statements and transactions per step of the benchmark's workload (bench/throughput.py), capped.

One run of 5 model calls and 4 tool calls, driven by ``runs.engine.loop.advance``
in this thread (the in-process worker's code path), of the benchmark's shape on
the tests' own tools (``tests.support.fake_tools``, which keep their records in
a ledger of their own, not in the database: what is counted is the engine's alone): ``fake_lookup`` three times
(read-only), ``fake_transfer`` of 60 (needs approval), a final answer. Every
statement of the worker's connection is recorded and cut into passes of the
loop (one per call of ``_step``, each with the next pass's look at the run
row); each pass is classified by the events it logged. The caps are what the
hot path costs today plus a little headroom, so waste cannot creep back
unnoticed. Only data statements are counted (SELECT, INSERT, UPDATE, DELETE,
and on PostgreSQL the data-modifying WITH that does several of them in one
statement), and transactions: one per statement outside ``atomic`` and one
per outermost ``atomic`` block that ran a statement.
"""

import dataclasses
import inspect
import re

import pytest
from django.db import connection

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.engine import loop
from runs.engine.lifecycle import start_run
from runs.models import Agent, RunEvent, RunStatus
from tests.support.core import CORE_TOOLS, lookup, transfer
from tools import registry

QUERY = {"tool_calls": [lookup("acme")]}
TURNS = [QUERY, QUERY, QUERY, {"tool_calls": [transfer("acme", 60)]}, {"content": "Sent 60 to acme."}]
STEPS = 9  # 5 model calls + 4 tool executions
DATA = re.compile(r"^\s*(WITH|SELECT|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)  # WITH: a data-modifying one

# Per database, per kind of pass: (data statements, transactions, transactions that write) at most:
# what each costs today plus one statement and one transaction of headroom; writing transactions
# exactly: one before the external call and one after it (the final answer adds the run's ending;
# the side effect, its target's claim). PostgreSQL does in one statement what SQLite does in two or
# three (a transaction's events with its run columns, another machine's row: runs.base.rows).
# History, on the demo's tools (which add their own reads): 34-49 statements a pass at first, then
# 20-27, then 17-24; per step 35.1, 17.8, 16.7, 14.0. On PostgreSQL a model's answer and a tool's outcome
# store their message in their events' statement since (8.7 statements a step to 7.7).
CAPS = {
    "postgresql": {
        "model turn": (8, 6, 2),
        "model turn asking for approval": (10, 5, 2),
        "read-only call": (4, 4, 2),
        "waiting for approval": (5, 2, 1),
        "side-effect call after approval": (10, 6, 3),
        "final answer": (12, 7, 3),
    },
    "sqlite": {
        "model turn": (13, 6, 2),
        "model turn asking for approval": (16, 5, 2),
        "read-only call": (9, 4, 2),
        "waiting for approval": (6, 2, 1),
        "side-effect call after approval": (15, 6, 3),
        "final answer": (17, 7, 3),
    },
}
# Statements and transactions of a slice outside its passes (taking and giving back the lease, loading the run), at
# most; and per step over the whole run (today 7.7 and 5.0 on PostgreSQL, 13.7 and 5.7 on SQLite).
SLICE_OVERHEAD = {"postgresql": (6, 5), "sqlite": (9, 7)}
PER_STEP = {"postgresql": (8.5, 5.5), "sqlite": (14.5, 6.5)}


@dataclasses.dataclass
class Statement:
    sql: str
    transaction: object  # the outermost atomic block it ran in, or a fresh object (autocommit)


class Recorder:
    """Every statement of this thread's connection, cut into the loop's passes."""

    def __init__(self):
        self.statements: list[Statement] = []
        self.cuts: list[tuple[int, int]] = []  # (index into statements, run's last_event_seq) at each pass start
        self.paused = False

    def __call__(self, execute, sql, params, many, context):
        if not self.paused:
            block = connection.atomic_blocks[0] if connection.in_atomic_block else object()
            self.statements.append(Statement(sql, block))
        return execute(sql, params, many, context)

    def wrap_step(self, step):
        def recorded(run, *args):
            self.paused = True
            seq = type(run).objects.values_list("last_event_seq", flat=True).get(pk=run.pk)
            self.paused = False
            self.cuts.append((len(self.statements), seq))
            return step(run, *args)
        return recorded

    def wrap_slice(self, advance_slice):
        def recorded(run_id, *args):
            try:
                return (yield from advance_slice(run_id, *args))
            finally:
                self.slice_ends.append(len(self.statements))
        self.slice_ends: list[int] = []
        return recorded


def _figures(statements: list[Statement]) -> tuple[int, int, int]:
    """(data statements, transactions, transactions that wrote) of a stretch of statements."""
    data = [s for s in statements if DATA.match(s.sql)]
    blocks = {id(s.transaction): s.transaction for s in data}
    writing = {id(s.transaction) for s in data if not s.sql.lstrip().upper().startswith("SELECT")}
    return len(data), len(blocks), len(writing)


def _kind(events: list[RunEvent]) -> str:
    """What a pass did, from the events it logged."""
    for event in events:
        if event.type == "model_call" and event.to_status == "succeeded":
            if event.payload["tool_calls"] == 0:
                return "final answer"
            if any(e.type == "interrupt" for e in events):
                return "model turn asking for approval"
            return "model turn"
        if event.type == "tool_call" and event.to_status == "succeeded":
            return "side-effect call after approval" if event.payload["name"] == "fake_transfer" else "read-only call"
        if event.type == "transition" and event.to_status == "waiting":
            return "waiting for approval"
    return "?"


def _outside_transactions(function, what: str):
    """``function`` (sync or ``async def``, which it stays) wrapped to fail if it is called with a database
    transaction open."""
    def check():
        assert not connection.in_atomic_block, f"{what} called inside a transaction"

    if inspect.iscoroutinefunction(function):
        async def checked_async(*args, **kwargs):
            check()
            return await function(*args, **kwargs)
        return checked_async

    def checked(*args, **kwargs):
        check()
        return function(*args, **kwargs)
    return checked


@pytest.fixture
def checked_external_calls(monkeypatch):
    """Model and tool calls (handlers and preconditions) must run outside transactions."""
    get_client = loop.get_client

    def client(config):
        real = get_client(config)
        return type("Checked", (), {"complete": staticmethod(_outside_transactions(real.complete, "the model"))})()

    monkeypatch.setattr(loop, "get_client", client)
    for name in CORE_TOOLS:
        tool = registry.get_tool(name)
        monkeypatch.setitem(registry._TOOLS, name, dataclasses.replace(
            tool, handler=_outside_transactions(tool.handler, f"{name} handler"),
            precondition=_outside_transactions(tool.precondition, f"{name} precondition")))


def test_each_kind_of_step_stays_within_its_statement_and_transaction_caps(
        idle_worker, people, monkeypatch, checked_external_calls):
    requester = people["requester"]
    agent = Agent.objects.create(slug="bench", name="bench", tools=CORE_TOOLS, completion_check="fake_transfer",
                                 model={"provider": "scripted", "turns": TURNS})
    run = start_run(agent=agent, user=requester, input="Send 60 to acme.")
    recorder = Recorder()
    monkeypatch.setattr(loop, "_step", recorder.wrap_step(loop._step))
    monkeypatch.setattr(loop, "advance_slice", recorder.wrap_slice(loop.advance_slice))

    ends = []  # where each call of advance ended
    with connection.execute_wrapper(recorder):
        loop.advance(run.pk)
        ends.append(len(recorder.statements))
        recorder.paused = True
        decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")
        recorder.paused = False
        loop.advance(run.pk)
        ends.append(len(recorder.statements))

    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert run.steps.count() == 5 and run.tool_calls.filter(status="succeeded").count() == 4

    events = list(run.events.order_by("seq"))
    starts = {index for index, _ in recorder.cuts}
    bounds = sorted(starts | set(recorder.slice_ends) | set(ends) | {0})
    passes, overhead = [], []
    for (start, seq), (_, next_seq) in zip(recorder.cuts, recorder.cuts[1:] + [(None, run.last_event_seq)]):
        stop = min(b for b in bounds if b > start)  # a pass ends where the next one begins, or its slice ends
        logged = [e for e in events if seq < e.seq <= next_seq]
        passes.append((_kind(logged), _figures(recorder.statements[start:stop])))
    for start, stop in zip(bounds, bounds[1:]):  # taking and giving back the lease, loading the run
        if start not in starts:
            overhead.append(_figures(recorder.statements[start:stop]))

    report = "\n".join(f"{kind}: {figures}" for kind, figures in passes) + f"\nslice overhead: {overhead}"
    total, transactions, _ = _figures(recorder.statements)
    print(f"{report}\nper step: {total / STEPS:.1f} statements, {transactions / STEPS:.1f} transactions")
    assert [kind for kind, _ in passes] == ["model turn", "read-only call"] * 3 + [
        "model turn asking for approval", "waiting for approval", "side-effect call after approval",
        "final answer"], report
    for kind, (statements, transactions, writing) in passes:
        cap = CAPS[connection.vendor][kind]
        assert statements <= cap[0] and transactions <= cap[1] and writing <= cap[2], \
            f"{kind}: {statements} statements, {transactions} transactions ({writing} writing) over {cap}\n{report}"
    for statements, transactions, _ in overhead:
        assert statements <= SLICE_OVERHEAD[connection.vendor][0], report
        assert transactions <= SLICE_OVERHEAD[connection.vendor][1], report
    per_step = PER_STEP[connection.vendor]
    assert total / STEPS <= per_step[0] and transactions / STEPS <= per_step[1], \
        f"{total / STEPS:.1f} statements and {transactions / STEPS:.1f} transactions per step\n{report}"
