"""The sweeper's jobs lock many runs' rows; under group commit (runs.engine.group_commit) a worker's
transaction holds the rows of several runs too, taken in no particular order. So the sweeper never waits
for a run's row while holding another's: it skips a busy row (``SKIP LOCKED``) and takes that run at its
next pass (on PostgreSQL: two sessions, each holding what the other one wants next)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs.engine.lifecycle import start_run
from runs.engine.sweep_jobs import wake_due_runs
from runs.models import Run, RunStatus, WaitingReason
from tests.support.durability import lookup_agent
from tests.support.sessions import group_writing, in_session

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql",
                                 reason="row locks held across sessions: PostgreSQL (SQLite serializes writers)")]


def test_waking_due_runs_skips_a_row_a_group_holds_and_takes_it_at_the_next_pass(people):
    """The cycle: a group holds a later run's row and its next job writes an earlier run's; the sweeper
    locks the earlier row, then would wait for the later one. It skips it instead, so the group goes on,
    and the skipped run is woken at the next pass."""
    agent = lookup_agent()
    first, second = [start_run(agent=agent, user=people["requester"], input=f"look {n} up") for n in range(2)]
    Run.objects.filter(pk__in=[first.pk, second.pk]).update(
        status=RunStatus.WAITING, waiting_reason=WaitingReason.RETRY_BACKOFF,
        wake_at=timezone.now() - timedelta(seconds=1))
    errors, swept = {}, []
    with group_writing(errors, later=second.pk, earlier=first.pk) as go:
        sweeper = in_session(errors, "sweeper", lambda: swept.append(wake_due_runs(now=timezone.now())))
        sweeper.join(10)  # a sweeper waiting for the later row would still be waiting
        go()
        sweeper.join()
    assert errors == {}  # no deadlock for PostgreSQL to break
    assert swept == [{"woken": 1}]
    assert Run.objects.get(pk=first.pk).status != RunStatus.WAITING
    assert Run.objects.get(pk=second.pk).status == RunStatus.WAITING  # busy then: left for the next pass
    assert wake_due_runs(now=timezone.now()) == {"woken": 1}
    assert Run.objects.get(pk=second.pk).status != RunStatus.WAITING
