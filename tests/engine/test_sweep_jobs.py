"""The sweeper as an ordered list of jobs (``runs.sweeping``), each app registering its own.

The product's jobs are those the installed apps register in their
``AppConfig.ready``; a pass runs them in order and reports each job's
counts. In a long-lived sweeper a job that fails is logged and the jobs
after it still run; a single pass raises.
"""

import io
import logging
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import DatabaseError
from django.utils import timezone

from runs import sweeping
from runs.engine.sweep_jobs import wake_due_runs
from runs.models import Run, Session
from runs.sweeping import JobResult, SweepJob, register_sweep_job, run_sweep, sweep, sweep_jobs, totals
from tests.support.core import pending_transfer

PRODUCT_JOBS = [
    "rescue_stranded",                   # the engine's (runs.apps)
    "start_scheduled_runs",
    "wake_due_runs",
    "expire_overdue_approvals",
    "fail_waiting_runs_past_deadline",
    "warn_claimed_items_expiring",       # the inbox's (approvals.apps)
    "reconcile_after_run_end",
    "discard_dead_flight_recorders",
    "sweep_webhooks",                    # the webhooks' backstop (runs.webhooks.apps)
]


def test_each_app_registers_its_own_jobs_and_a_pass_runs_them_in_order():
    assert [job.name for job in sweep_jobs()] == PRODUCT_JOBS
    assert sweep_jobs()[-1].fn.__module__ == "runs.webhooks.services"
    assert [job.fn.__module__ for job in sweep_jobs()].count("approvals.notifications") == 1


def test_a_name_is_one_job(monkeypatch):
    monkeypatch.setattr(sweeping, "_JOBS", dict(sweeping._JOBS))
    again = register_sweep_job("wake_due_runs", wake_due_runs, order=300)  # a second ready(): nothing changes
    assert again in sweep_jobs() and len(sweep_jobs()) == len(PRODUCT_JOBS)
    with pytest.raises(ImproperlyConfigured, match="wake_due_runs"):
        register_sweep_job("wake_due_runs", lambda *, now: {}, order=300)


def test_two_jobs_may_not_report_the_same_count():
    assert totals([JobResult("a", {"woken": 1}), JobResult("b", {"started": 2})]) == {"woken": 1, "started": 2}
    with pytest.raises(ImproperlyConfigured, match="woken"):
        totals([JobResult("a", {"woken": 1}), JobResult("b", {"woken": 2})])


def _due_backoff(requester) -> Run:
    """A run waiting in a retry backoff whose ``wake_at`` has passed."""
    agent = pending_transfer(requester=requester, expires_in=None).run.agent
    session = Session.objects.create(owner=requester, agent=agent)
    return Run.objects.create(session=session, agent=agent, requested_by=requester, input="backoff", status="waiting",
                              waiting_reason="retry_backoff", started_at=timezone.now(),
                              wake_at=timezone.now() - timedelta(seconds=1))


def test_a_failing_job_is_logged_and_the_jobs_after_it_still_run_in_a_long_lived_sweeper(
        people, idle_worker, monkeypatch, caplog):
    run = _due_backoff(people["requester"])

    def broken(*, now):
        raise DatabaseError("the database is restarting")

    monkeypatch.setattr(sweeping, "_JOBS", {**sweeping._JOBS, "broken": SweepJob("broken", broken, order=250)})
    with pytest.raises(DatabaseError):  # a single pass stops at the error: nothing after it ran
        sweep()
    assert Run.objects.get(pk=run.pk).status == "waiting"

    with caplog.at_level(logging.INFO, logger="runs.sweeping"):
        results = run_sweep(keep_going=True)
    assert [result.name for result in results] == PRODUCT_JOBS[:2] + ["broken"] + PRODUCT_JOBS[2:]
    by_name = {result.name: result for result in results}
    assert by_name["broken"] == JobResult("broken", {}, failed=True)
    assert by_name["wake_due_runs"] == JobResult("wake_due_runs", {"woken": 1})
    assert Run.objects.get(pk=run.pk).status == "running"
    logged = {(record.levelname, record.getMessage()) for record in caplog.records}
    assert ("ERROR", "sweep job broken failed") in logged
    assert ("INFO", "sweep job wake_due_runs: woken=1") in logged


def test_one_pass_of_the_command_prints_every_jobs_counts(people, idle_worker):
    _due_backoff(people["requester"])
    output = io.StringIO()
    call_command("recover_runs", stdout=output)
    printed = dict(pair.split("=") for pair in output.getvalue().split())
    assert printed["woken"] == "1"
    assert {"reenqueued", "started", "expired", "past_deadline", "expiry_warnings", "reconciled", "discarded",
            "webhook_events", "webhook_chains_woken"} <= printed.keys()
