"""Lock order of a transition whose row rides on its event's statement (PostgreSQL: ``runs.base.rows``'s
``also``): the run's row first, then the machine's own row, as every writer takes them (``runs.tx``). Two
sessions: one holds the run's row; the transition waits for it holding nothing of the tool call's."""

import threading

import pytest
from django.db import connection, transaction

from runs.engine.lifecycle import start_run
from runs.models import Run, Step
from runs.transitions import apply
from tests.support.durability import lookup_agent
from tests.support.sessions import in_session, wait_for_a_lock_wait
from tools.models import ToolCall, ToolCallStatus

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql",
                                 reason="one statement writes both rows on PostgreSQL only; SQLite serializes writers")]


def test_a_call_waiting_for_its_runs_row_holds_no_lock_on_its_own_row(people):
    run = start_run(agent=lookup_agent(), user=people["requester"], input="look a up")
    apply(run.start, actor="worker")
    call = ToolCall.objects.create(run=run, step=Step.objects.create(run=run, index=0), index=0,
                                   provider_call_id="c0", name="fake_lookup", arguments={"key": "a"})
    errors, holds_the_run, go = {}, threading.Event(), threading.Event()

    def another_writer():  # a person's decision, a cancel: the run's row first
        with transaction.atomic():
            Run.objects.select_for_update().get(pk=run.pk)
            holds_the_run.set()
            go.wait(20)

    writer = in_session(errors, "writer", another_writer)
    try:
        assert holds_the_run.wait(20)
        transition = in_session(errors, "transition", lambda: apply(call.request_approval, actor="worker"))
        wait_for_a_lock_wait("WITH written AS (UPDATE")  # the transition's statement waits for the run's row
        with transaction.atomic():  # ...and has not taken the call's row meanwhile
            ToolCall.objects.select_for_update(nowait=True).get(pk=call.pk)
    finally:
        go.set()
        writer.join()
    transition.join()
    assert errors == {}
    assert ToolCall.objects.get(pk=call.pk).status == ToolCallStatus.AWAITING_APPROVAL
