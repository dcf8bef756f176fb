"""Worker heartbeats (issue 25): every worker process says it is alive and how busy it is; operators see stale ones.

Through a real Dramatiq worker in this process (the ``worker`` fixture) and
a transfer whose bank answers slowly (``tests.support.fake_tools.TransferBank``),
so a run is in flight while the heartbeat beats.
"""

import os
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from approvals.services import decide_interrupt
from runs.engine.heartbeat import beat
from runs.engine.lifecycle import start_run
from runs.lease import WORKER_ID
from runs.models import RunStatus
from runs.ops.models import WorkerHeartbeat
from tests.support.core import asking_agent
from tests.support.fake_tools import transfer_bank

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fast_beats(settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WORKER_HEARTBEAT_S": 0.1}


def _wait_for(predicate, timeout_s: float = 10):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_worker_beats_while_it_runs_with_its_runs_in_flight_and_its_row_goes_when_it_stops(
        fast_beats, idle_worker, people, monkeypatch):
    idle_worker.worker.start()
    _wait_for(lambda: WorkerHeartbeat.objects.filter(worker_id=WORKER_ID).exists())
    row = WorkerHeartbeat.objects.get(worker_id=WORKER_ID)
    assert (row.host, row.pid, row.runs_in_flight, row.abandoned_threads) == (socket.gethostname(), os.getpid(), 0, 0)
    assert "default" in row.queues.split(",") and not row.is_stale()
    first_seen = row.last_seen
    _wait_for(lambda: WorkerHeartbeat.objects.get(worker_id=WORKER_ID).last_seen > first_seen)

    run = start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme.")
    idle_worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    transfer_bank(monkeypatch).delay_s = 3.0  # the transfer is in flight for 3 s
    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="approved")
    _wait_for(lambda: WorkerHeartbeat.objects.get(worker_id=WORKER_ID).runs_in_flight == 1)
    idle_worker.drain()
    _wait_for(lambda: WorkerHeartbeat.objects.get(worker_id=WORKER_ID).runs_in_flight == 0)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED

    idle_worker.worker.stop()  # a clean stop: the row goes (a row left to go stale is a worker that died)
    assert not WorkerHeartbeat.objects.filter(worker_id=WORKER_ID).exists()


def _row(worker_id: str, silent_s: float) -> WorkerHeartbeat:
    now = timezone.now()
    return WorkerHeartbeat.objects.create(worker_id=worker_id, host="w1", pid=1, started_at=now - timedelta(days=2),
                                          last_seen=now - timedelta(seconds=silent_s))


def test_a_silent_worker_is_stale_after_three_missed_beats_and_pruned_later(settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WORKER_HEARTBEAT_S": 10.0, "WORKER_PRUNE_AFTER_S": 3600.0}
    fresh, stale, gone = _row("fresh", 29), _row("stale", 31), _row("gone", 3601)
    assert (fresh.is_stale(), stale.is_stale(), gone.is_stale()) == (False, True, True)

    beat(worker_id="me", queues="default", started_at=timezone.now(), runs_in_flight=2, abandoned=1)

    assert set(WorkerHeartbeat.objects.values_list("worker_id", flat=True)) == {"fresh", "stale", "me"}
    me = WorkerHeartbeat.objects.get(worker_id="me")
    assert (me.runs_in_flight, me.abandoned_threads, me.pid) == (2, 1, os.getpid())


def test_the_admin_shows_heartbeats_read_only_and_which_are_stale(client, people, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WORKER_HEARTBEAT_S": 10.0}
    _row("w1:11:aaaaaa", 1)
    _row("w1:12:bbbbbb", 120)
    client.force_login(people["admin"])
    page = client.get(reverse("admin:ops_workerheartbeat_changelist")).content.decode()
    rows = {line.split("w1:")[1][:9]: line for line in page.split("<tr") if "w1:1" in line}
    assert "icon-yes" in rows["11:aaaaaa"] and "icon-no" in rows["12:bbbbbb"]
    change = client.get(reverse("admin:ops_workerheartbeat_change", args=[WorkerHeartbeat.objects.first().pk]))
    assert change.status_code == 200 and b'name="runs_in_flight"' not in change.content
    assert client.post(reverse("admin:ops_workerheartbeat_add")).status_code == 403


def test_two_workers_in_one_process_share_one_row_until_the_last_stops(fast_beats, transactional_db):
    import dramatiq

    from runs.management.commands.serve import embedded_workers

    runs_worker, webhook_worker = embedded_workers(dramatiq.get_broker(), run_threads=1, webhook_threads=1)
    runs_worker.start()
    webhook_worker.start()
    try:
        _wait_for(lambda: WorkerHeartbeat.objects.filter(worker_id=WORKER_ID, queues__contains="webhooks").exists())
        assert set(WorkerHeartbeat.objects.get().queues.split(",")) >= {"default", "webhooks"}
        runs_worker.stop()
        time.sleep(0.3)  # a few beats: the row stays while one worker runs
        assert WorkerHeartbeat.objects.filter(worker_id=WORKER_ID).exists()
    finally:
        runs_worker.stop()
        webhook_worker.stop()
    assert not WorkerHeartbeat.objects.exists()
    assert not [t for t in threading.enumerate() if t.name == "tollgate-heartbeat"]
