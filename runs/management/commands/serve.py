"""``manage.py serve``: the one-command Tollgate server.

Serves HTTP and WebSockets (Daphne; static files through WhiteNoise, as
in production, whether DEBUG is on or off). In the embedded shape (no ``REDIS_URL``, Dramatiq's StubBroker) it
also runs a Dramatiq worker and the sweeper (``recover_runs.sweep_all``: runs
and webhooks, every ``TOLLGATE["SWEEP_INTERVAL_S"]``) inside this process, re-enqueues
runs left queued or running by a previous process. Unless told not to, it
starts the demo payment gateway when nothing answers at ``GATEWAY_URL``. With
a real broker it only serves; workers and the sweeper are separate
``manage.py rundramatiq`` and ``manage.py recover_runs --loop`` processes.
"""

import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import dramatiq
import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from dramatiq.brokers.stub import StubBroker

import runs.engine.actors  # noqa: F401  (declares the advance actor for the in-process worker)
from runs.management.commands.recover_runs import sweep_all
from runs.models import Run, RunStatus
from runs.wakeups import wake_now


def start_demo_gateway(stdout) -> subprocess.Popen | None:
    """Start the demo payment gateway at ``GATEWAY_URL`` unless something already answers there.

    Only for a loopback ``GATEWAY_URL``; its ledger is ``var/gateway-ledger.sqlite3``.
    """
    url = urlparse(settings.GATEWAY_URL)
    if url.hostname not in ("127.0.0.1", "localhost"):
        return None
    try:
        httpx.get(f"{settings.GATEWAY_URL}/health", timeout=0.5)
        return None
    except httpx.TransportError:
        pass
    ledger = Path(settings.BASE_DIR) / "var" / "gateway-ledger.sqlite3"
    ledger.parent.mkdir(exist_ok=True)
    process = subprocess.Popen([sys.executable, "-m", "tools.gateway_server", "--host", url.hostname,
                                "--port", str(url.port or 80), "--ledger", str(ledger)], cwd=settings.BASE_DIR)
    stdout.write(f"Demo payment gateway started at {settings.GATEWAY_URL} (ledger {ledger}).")
    return process


def requeue_active_runs() -> list[int]:
    """Enqueue ``advance_run`` for every queued or running run; return their ids.

    An in-process worker that died with its process leaves such runs
    behind; the loop picks each up from its stored state.
    """
    run_ids = list(Run.objects.filter(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
                   .order_by("id").values_list("id", flat=True))
    for run_id in run_ids:
        wake_now(run_id)
    return run_ids


class Sweeper(threading.Thread):
    """Runs ``recover_runs.sweep_all`` (runs, then webhooks) every ``interval_s`` seconds until ``stop()``."""

    def __init__(self, interval_s: float):
        super().__init__(name="tollgate-sweeper", daemon=True)
        self.interval_s = interval_s
        self._stopped = threading.Event()

    def run(self):
        while not self._stopped.wait(self.interval_s):
            sweep_all()  # logs a failed pass itself: it never ends the sweeper

    def stop(self):
        self._stopped.set()


class Command(BaseCommand):
    help = ("Serve Tollgate (HTTP + WebSockets + static files). Without REDIS_URL, also run "
            "the Dramatiq worker and the sweeper in this process.")

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000",
                            help="Address and port to listen on (default 127.0.0.1:8000).")
        parser.add_argument("--worker-threads", type=int, default=2,
                            help="Threads of the in-process worker (embedded shape only).")
        parser.add_argument("--no-gateway", action="store_true",
                            help="Do not start the demo payment gateway (see tools/gateway_server.py).")

    def handle(self, *args, addrport, worker_threads, no_gateway, **options):
        broker = dramatiq.get_broker()
        worker = sweeper = None
        gateway = None if no_gateway else start_demo_gateway(self.stdout)
        if isinstance(broker, StubBroker):
            worker = dramatiq.Worker(broker, worker_threads=worker_threads, worker_timeout=250)
            worker.start()
            self.stdout.write(f"In-process Dramatiq worker started ({worker_threads} threads).")
            requeued = requeue_active_runs()
            if requeued:
                self.stdout.write(f"Re-enqueued {len(requeued)} unfinished run(s): {requeued}")
            sweeper = Sweeper(settings.TOLLGATE["SWEEP_INTERVAL_S"])
            sweeper.start()
        else:
            self.stdout.write(f"Broker {type(broker).__name__}: serving only; run workers with "
                              "`manage.py rundramatiq` and the sweeper with `manage.py recover_runs --loop`.")
        try:
            call_command("runserver", addrport, use_reloader=False, use_static_handler=False)
        finally:
            if gateway is not None:
                gateway.terminate()
            if sweeper is not None:
                sweeper.stop()
            if worker is not None:
                self.stdout.write("Stopping the in-process worker...")
                worker.stop()
