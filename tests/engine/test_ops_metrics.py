"""``/metrics`` (issue 25): after a scripted workload it shows what the database shows and what the processes counted
(``runs.base.process_metrics``), merged across processes through ``PROMETHEUS_MULTIPROC_DIR``; it is closed unless
configured.

The processes' counters live as long as the test process: the tests here
compare a scrape after the workload with one before it.
"""

import dataclasses
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

import dramatiq

from approvals.models import Interrupt, InterruptStatus
from approvals.services import decide_interrupt
from runs.engine.lifecycle import start_run as start_run_here
from runs.lease import WORKER_ID
from runs.management.commands import recover_runs
from runs.models import Run, RunStatus
from runs import sweeping
from runs.ops.models import WorkerHeartbeat
from runs.wakeups import ADVANCE_ACTOR, ADVANCE_QUEUE
from runs.webhooks.models import WebhookDelivery
from tests.support.api import create_agent, start_run
from tests.support.core import asking_agent, refused_agent
from tests.support.fake_tools import transfer_bank
from tests.support.processes import database_url_for_subprocess
from tests.engine.test_engine_runtime import calling, hung, use_tool, wait_until  # noqa: F401  (hung: a fixture)
from tools.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "metrics-token-for-the-tests-0123456789"


@pytest.fixture
def metrics_token(settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "METRICS_TOKEN": TOKEN}


def scrape() -> dict[str, dict[tuple, float]]:
    """``{metric name: {sorted label pairs: value}}`` from ``/metrics``, asked with the token."""
    response = Client(HTTP_HOST="10.0.3.7:8000").get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    """The sample ``name`` with exactly ``labels`` (0 when absent)."""
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0)


ADVANCE = {"queue_name": ADVANCE_QUEUE, "actor_name": ADVANCE_ACTOR}


def test_the_endpoint_does_not_exist_unless_a_token_is_configured(settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "METRICS_TOKEN": ""}
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 404


def test_a_scrape_without_the_token_is_refused(metrics_token):
    client = Client()
    for authorization in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": f"Token {TOKEN}"},
                          {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}x"}):
        response = client.get("/metrics", **authorization)
        assert (response.status_code, response["WWW-Authenticate"]) == (401, 'Bearer realm="metrics"')
        assert TOKEN.encode() not in response.content and b"tollgate_" not in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}").status_code == 200


def test_after_a_scripted_workload_the_metrics_show_the_databases_counts(metrics_token, people, worker, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    done = create_agent(admin, "says-done", [{"content": "Done."}], tools=[], completion_check="default")
    for _ in range(2):
        start_run(requester, done["slug"], "Say done.")
    approved, rejected, waiting = (start_run(requester, asking_agent().slug, "Send 80 to acme.") for _ in range(3))
    worker.drain()
    decide_interrupt(interrupt=Interrupt.objects.get(run_id=approved["id"]), user=people["approver"],
                     decision="approved")
    decide_interrupt(interrupt=Interrupt.objects.get(run_id=rejected["id"]), user=people["approver"],
                     decision="rejected")
    worker.drain()
    deadline = time.monotonic() + 10
    while not WorkerHeartbeat.objects.filter(worker_id=WORKER_ID).exists():  # its first beat is on its way
        assert time.monotonic() < deadline
        time.sleep(0.05)

    samples = scrape()

    runs = Counter((status, reason if status == RunStatus.WAITING else "")
                   for status, reason in Run.objects.values_list("status", "waiting_reason"))
    shown = {(dict(labels)["status"], dict(labels)["waiting_reason"]): value
             for labels, value in samples["tollgate_runs"].items()}
    assert {key: value for key, value in shown.items() if value} == runs
    assert runs[("waiting", "approval")] == 1 and runs[("completed", "")] >= 3 and sum(shown.values()) == 5
    assert set(RunStatus.values) == {status for status, _ in shown}  # every status, 0 or not
    used = Run.objects.values_list("input_tokens", "output_tokens", "cost_usd")
    assert samples["tollgate_run_tokens"][(("direction", "input"),)] == sum(row[0] for row in used) > 0
    assert samples["tollgate_run_tokens"][(("direction", "output"),)] == sum(row[1] for row in used) > 0
    assert samples["tollgate_run_cost_usd"][()] == float(sum(row[2] for row in used))

    pending = Interrupt.objects.filter(status=InterruptStatus.PENDING)
    assert samples["tollgate_inbox_pending"][(("kind", "approval"),)] == pending.filter(kind="approval").count() == 1
    assert 0 < samples["tollgate_inbox_oldest_pending_age_seconds"][(("kind", "approval"),)] < 600
    assert samples["tollgate_inbox_oldest_pending_age_seconds"][(("kind", "input"),)] == 0

    calls = Counter(ToolCall.objects.values_list("status", flat=True))
    shown_calls = {labels[0][1]: value for labels, value in samples["tollgate_tool_calls"].items()}
    assert {status: value for status, value in shown_calls.items() if value} == calls
    assert calls["succeeded"] >= 2 and calls["rejected"] == 1 and calls["awaiting_approval"] == 1
    assert samples["tollgate_tool_calls_oldest_unknown_age_seconds"][()] == 0

    deliveries = Counter(WebhookDelivery.objects.values_list("status", flat=True))
    assert {labels[0][1]: value for labels, value in samples["tollgate_webhook_deliveries"].items() if value} == \
        deliveries

    assert samples["tollgate_workers"][(("state", "live"),)] == WorkerHeartbeat.objects.count() >= 1
    assert samples["tollgate_worker_runs_in_flight"][(("worker", WORKER_ID),)] == 0
    assert 0 <= samples["tollgate_worker_last_seen_age_seconds"][(("worker", WORKER_ID),)] < 60


def test_a_scrape_costs_one_query_per_family_however_many_rows(metrics_token, people, worker, api):
    with CaptureQueriesContext(connection) as empty:
        scrape()
    for _ in range(3):
        start_run(api(people["requester"]), asking_agent().slug, "Send 80 to acme.")
    worker.drain()
    with CaptureQueriesContext(connection) as busy:
        scrape()
    assert len(empty.captured_queries) == len(busy.captured_queries) == 5  # runs, inbox, tool calls, webhooks, workers


def test_a_short_token_is_refused_at_start_and_a_token_is_never_shown():
    short = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=settings.BASE_DIR,
                           env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
                                "TOLLGATE_METRICS_TOKEN": "guessable"}, capture_output=True, text=True, timeout=60)
    assert short.returncode != 0 and "TOLLGATE_METRICS_TOKEN must be at least 32 characters" in short.stderr
    assert "guessable" not in short.stderr


def test_the_processes_count_model_calls_steps_and_messages_of_a_workload(metrics_token, people, worker, api,
                                                                         monkeypatch):
    before = scrape()
    admin, requester = api(people["admin"]), api(people["requester"])
    done = create_agent(admin, "says-done", [{"content": "Done."}], tools=[], completion_check="default")
    ids = [start_run(requester, done["slug"], "Say done.")["id"] for _ in range(2)]
    ids.append(start_run(requester, asking_agent().slug, "Send 80 to acme.")["id"])
    worker.drain()
    sending = Run.objects.get(pk=ids[-1])
    transfer_bank(monkeypatch).delay_s = 2.0  # the transfer is in flight a while: the run shows in flight meanwhile
    decide_interrupt(interrupt=sending.interrupts.get(), user=people["approver"], decision="approved")
    wait_until(lambda: value(scrape(), "tollgate_process_runs_in_flight") == 1)
    worker.drain()
    after = scrape()

    runs = Run.objects.filter(pk__in=ids)
    assert set(runs.values_list("status", flat=True)) == {RunStatus.COMPLETED}
    model_calls = sum(runs.values_list("model_calls", flat=True))
    calls = "tollgate_model_call_duration_seconds_count"
    assert value(after, calls, provider="scripted", outcome="ok") - \
        value(before, calls, provider="scripted", outcome="ok") == model_calls == 5  # 1 + 1 + 3
    assert value(after, calls, provider="scripted", outcome="error") == value(before, calls, provider="scripted",
                                                                           outcome="error")
    executed = ToolCall.objects.filter(run_id__in=ids, attempts__gt=0).count()
    steps = "tollgate_step_duration_seconds_count"
    assert value(after, steps) - value(before, steps) >= model_calls + executed  # each is a pass of its own
    assert value(after, "tollgate_process_runs_in_flight") == 0

    # One message per run started, one for the approval's wake-up, and any slice handed back to the queue:
    # each message's lag is observed once, and Dramatiq's counts agree.
    messages = value(after, "dramatiq_messages_total", **ADVANCE) - value(before, "dramatiq_messages_total", **ADVANCE)
    assert messages >= len(ids) + 1
    for name in ("tollgate_queue_lag_seconds_count", "dramatiq_message_duration_milliseconds_count"):
        assert value(after, name, **ADVANCE) - value(before, name, **ADVANCE) == messages
    assert value(after, "dramatiq_message_errors_total", **ADVANCE) == value(before, "dramatiq_message_errors_total",
                                                                            **ADVANCE)
    assert value(after, "dramatiq_messages_inprogress", **ADVANCE) == 0


def test_sweeper_passes_are_counted_with_what_they_did(metrics_token, people, idle_worker, settings, monkeypatch):
    settings.TOLLGATE = {**settings.TOLLGATE, "QUEUED_GRACE_S": 0.0}
    start_run_here(agent=refused_agent(), user=people["requester"], input="send 500 to acme")
    dramatiq.get_broker().flush_all()  # the broker lost the wake-up: the sweeper sends it again
    before = scrape()
    first, second = recover_runs.sweep_all(), recover_runs.sweep_all()

    def broken(*, now):
        raise ConnectionError("the database is restarting")

    rescue = sweeping.sweep_jobs()[0]
    assert rescue.name == "rescue_stranded"
    monkeypatch.setitem(sweeping._JOBS, rescue.name, dataclasses.replace(rescue, fn=broken))
    recover_runs.sweep_all()
    after = scrape()

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert first[0].counts["reenqueued"] == 1
    assert (delta("tollgate_sweeper_passes_total", job=rescue.name, result="ok"),
            delta("tollgate_sweeper_passes_total", job=rescue.name, result="failed")) == (2, 1)
    assert len(first) > 2 and [result.name for result in first] == [job.name for job in sweeping.sweep_jobs()]
    for job in first[1:]:  # every other job (the webhooks' backstop among them) passed three times
        assert delta("tollgate_sweeper_passes_total", job=job.name, result="ok") == 3
    for one, two in zip(first, second):
        for action in one.counts:
            assert delta("tollgate_sweeper_actions_total", job=one.name, action=action) == \
                one.counts[action] + two.counts[action]


def test_an_abandoned_tool_thread_is_counted_until_it_ends(metrics_token, people, worker, monkeypatch, hung):
    def stuck(ctx, args):
        hung.wait()  # ignores its timeout: only the test lets it go
        return {"late": True}

    use_tool(monkeypatch, "stuck_lookup", stuck, timeout_s=0.5, max_attempts=1)
    before = scrape()
    run = start_run_here(agent=calling("stuck", "stuck_lookup"), user=people["requester"], input="x")
    worker.drain()
    assert ToolCall.objects.get(run=run).status == "failed"
    stuck_now = scrape()
    assert value(stuck_now, "tollgate_tool_threads_abandoned_total") - \
        value(before, "tollgate_tool_threads_abandoned_total") == 1
    assert value(stuck_now, "tollgate_process_abandoned_tool_threads") == \
        value(before, "tollgate_process_abandoned_tool_threads") + 1
    hung.set()
    wait_until(lambda: value(scrape(), "tollgate_process_abandoned_tool_threads") ==
               value(before, "tollgate_process_abandoned_tool_threads"))
    assert value(scrape(), "tollgate_tool_threads_abandoned_total") == \
        value(stuck_now, "tollgate_tool_threads_abandoned_total")  # a total: it stays


def test_metrics_of_several_processes_are_merged_through_the_multiprocess_directory(
        metrics_token, people, idle_worker, tmp_path, monkeypatch):
    """Two sweeper processes and a worker process of one host write to PROMETHEUS_MULTIPROC_DIR; a scrape here
    shows their sums (and nothing of this process's own values, counted in the tests before). The processes
    run with the tests' settings (``DJANGO_SETTINGS_MODULE`` as here), so the worker has the tests' own tools."""
    idle_worker.worker.start()
    run = start_run_here(agent=asking_agent(), user=people["requester"], input="Send 80 to acme.")
    idle_worker.drain()
    idle_worker.worker.stop()
    run.refresh_from_db()
    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="approved")
    model_calls_here = run.model_calls
    recover_runs.sweep_all()  # counted in this process: not in the directory

    directory = tmp_path / "prometheus"
    directory.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(), "REDIS_URL": "",
           "DJANGO_SETTINGS_MODULE": os.environ["DJANGO_SETTINGS_MODULE"], "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    sweeper = ("import django; django.setup(); "
               "from runs.management.commands.recover_runs import sweep_all; sweep_all()")
    worker_process = ("import django; django.setup(); from runs.engine.actors import advance_run; "
                      "from runs.engine.runtime import engine; "
                      f"advance_run({run.pk}); engine().wait_idle(60)")
    for code in (sweeper, sweeper, worker_process):
        done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert any(directory.iterdir())

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    merged = scrape()
    assert value(merged, "tollgate_sweeper_passes_total", job="rescue_stranded", result="ok") == 2
    assert value(merged, "tollgate_sweeper_passes_total", job="sweep_webhooks", result="ok") == 2
    calls = "tollgate_model_call_duration_seconds_count"
    assert value(merged, calls, provider="scripted", outcome="ok") == run.model_calls - model_calls_here == 1
    assert sum(value for value in merged["tollgate_process_runs_in_flight"].values()) == 0
    assert {dict(labels).get("pid") for labels in merged["tollgate_process_runs_in_flight"]} - {None}
    assert value(merged, "tollgate_runs", status="completed", waiting_reason="") == \
        Run.objects.filter(status=RunStatus.COMPLETED).count()  # the database's families are there too
