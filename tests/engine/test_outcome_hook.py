"""A tool call's outcome with its hooks (runs/engine/loop.py ``_execute``, tools/services/execution.py ``outcome``).

The result messages are built (``with_outcome``) once the outcome is set in memory, before it is written, and the
run's death streaks end with it (``run_columns``). When the database refuses that write,
``tools.services.execution._store_result`` stores another outcome (``failed`` / ``unknown``, "cannot be stored")
in a fresh savepoint: what the refused one would have written must come with that one, and the loop's run
instance must say what the row holds. A reviewer's test.
"""

from django.db import DataError

from runs import transitions
from runs.engine import loop
from runs.engine.lifecycle import start_run
from runs.models import Agent, Run, RunStatus
from tests.support.core import CORE_TOOLS, lookup
from tools.models import ToolCall, ToolCallStatus

S = ToolCallStatus


def _agent(turns) -> Agent:
    return Agent.objects.create(slug="hooked", name="hooked", tools=CORE_TOOLS, completion_check="default",
                                model={"provider": "scripted", "turns": turns})


def _refuse_the_first_success(monkeypatch) -> list:
    """The first outcome ``succeeded`` of a tool call is refused by the database (as ``_store_result`` expects
    of a result PostgreSQL will not take): nothing of its statement is written."""
    append_events = transitions.append_events
    refused = []

    def refusing(run, events, **kwargs):
        calls = [instance for instance, _fields, _expected in kwargs.get("row_writes", ())
                 if isinstance(instance, ToolCall) and instance.status == S.SUCCEEDED]
        if calls and not refused:
            refused.append(calls[0].pk)
            raise DataError("refused by the database")
        return append_events(run, events, **kwargs)

    monkeypatch.setattr(transitions, "append_events", refusing)
    return refused


def test_an_outcome_stored_after_a_refused_result_still_clears_the_runs_death_streaks(
        idle_worker, people, monkeypatch):
    """A call that got through an attempt ends the run's streaks (``crash_streak`` etc.), in the outcome's
    transaction. The hook clears them in memory and in the database on its first call; that first write is
    rolled back with the refused outcome, and on the second call (the ``failed`` outcome that is stored)
    the instance already says 0, so the database keeps the streak: the run's row and the loop's instance
    disagree, and the next death is counted on top of a streak that should have been over."""
    agent = _agent([{"tool_calls": [lookup("acme")]}, {"content": "Done."}])
    run = start_run(agent=agent, user=people["requester"], input="look acme up")
    refused = _refuse_the_first_success(monkeypatch)
    execute = loop._execute
    seen = []

    def after_a_death(run, known, call):
        # A death counted at a takeover just before this pass (as runs.engine.recovery counts it): the row and
        # the loop's instance both hold it.
        Run.objects.filter(pk=run.pk).update(crash_streak=1, suspect=True)
        run.crash_streak, run.suspect = 1, True
        going_on = yield from execute(run, known, call)
        seen.append((Run.objects.values_list("crash_streak", "suspect").get(pk=run.pk),
                     (run.crash_streak, run.suspect), ToolCall.objects.get(pk=call.pk).status))
        return going_on

    monkeypatch.setattr(loop, "_execute", after_a_death)
    loop.advance(run.pk)

    run.refresh_from_db()
    assert refused and run.status == RunStatus.COMPLETED
    stored, in_memory, status = seen[0]
    assert status == S.FAILED  # "cannot be stored": the call got through its attempt
    assert in_memory == (0, False)
    assert stored == in_memory, "the outcome's transaction committed without clearing the streaks"

