"""``/metrics`` (issue 25): after a scripted workload it shows what the database shows; it is closed unless configured."""

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

from approvals.models import Interrupt, InterruptStatus
from approvals.services import decide_interrupt
from runs.lease import WORKER_ID
from runs.models import Run, RunStatus
from runs.ops.models import WorkerHeartbeat
from runs.webhooks.models import WebhookDelivery
from tests.api_helpers import create_agent, start_run
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


def test_after_a_scripted_workload_the_metrics_show_the_databases_counts(metrics_token, demo, worker, api):
    admin, requester = api(demo["admin"]), api(demo["requester"])
    done = create_agent(admin, "says-done", [{"content": "Done."}], tools=[], completion_check="default")
    for _ in range(2):
        start_run(requester, done["slug"], "Say done.")
    approved, rejected, waiting = (start_run(requester, "refund-order") for _ in range(3))
    worker.drain()
    decide_interrupt(interrupt=Interrupt.objects.get(run_id=approved["id"]), user=demo["approver"],
                     decision="approved")
    decide_interrupt(interrupt=Interrupt.objects.get(run_id=rejected["id"]), user=demo["approver"],
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


def test_a_scrape_costs_one_query_per_family_however_many_rows(metrics_token, demo, worker, api):
    with CaptureQueriesContext(connection) as empty:
        scrape()
    for _ in range(3):
        start_run(api(demo["requester"]), "refund-order")
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
