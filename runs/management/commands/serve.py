"""``manage.py serve``: the one-command Tollgate server.

Serves HTTP and WebSockets (Daphne's development server running
``config.http_server.BodyLimitedServer``, so no request body over
``TOLLGATE["REQUEST_BODY_MAX_BYTES"]`` is read; static files through
WhiteNoise, as in production, whether DEBUG is on or off). In the embedded shape (no ``REDIS_URL``, Dramatiq's StubBroker) it
also runs two Dramatiq workers (``embedded_workers``: one for runs, one for
webhook deliveries, each with its own threads) and the sweeper (``recover_runs.sweep_all``: every
registered sweep job, every ``TOLLGATE["SWEEP_INTERVAL_S"]``) inside this process, re-enqueues
runs left queued or running by a previous process. Unless told not to
(``--no-services``), it first lets installed apps start their own services
(``runs.serving``; the demo app starts its payment gateway). With
a real broker it only serves; workers and the sweeper are separate
``manage.py rundramatiq`` and ``manage.py recover_runs --loop`` processes
(``rundramatiq --queues default`` for runs, ``--queues webhooks`` for deliveries). With ``DEBUG`` off it
refuses to start without a ``SECRET_KEY`` (``config.secret_key``).
"""

import threading

import dramatiq
from daphne.management.commands.runserver import Command as DaphneRunserver
from django.conf import settings
from django.core.management import call_command
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from dramatiq.brokers.stub import StubBroker

import runs.engine.actors  # noqa: F401  (declares the advance actor for the in-process worker)
from approvals.notifications import NOTIFY_QUEUE
from config.http_server import BodyLimitedServer
from config.secret_key import require_secret_key
from runs.management.commands.recover_runs import sweep_all
from runs.models import Run, RunStatus
from runs.serving import start_services
from runs.wakeups import ADVANCE_QUEUE, quarantine_queue, wake_now
from runs.webhooks.nudges import QUEUE as WEBHOOK_QUEUE

# The queues of the run worker: runs (advance_run) and email notifications.
RUN_QUEUES = frozenset({ADVANCE_QUEUE, NOTIFY_QUEUE})
WORKER_TIMEOUT_MS = 250
RUN_THREADS = 2  # serve's --worker-threads
WEBHOOK_THREADS = 4  # serve's --webhook-threads


def embedded_workers(broker, *, run_threads: int = RUN_THREADS,
                     webhook_threads: int = WEBHOOK_THREADS) -> tuple[dramatiq.Worker, dramatiq.Worker]:
    """The embedded shape's workers, not started: ``(run worker on RUN_QUEUES and the quarantine queue if there
    is one, webhook worker on its queue)``: the one run worker advances the suspects sent on to
    ``TOLLGATE["QUARANTINE_QUEUE"]`` too (the ``advance_suspect`` actor), or nobody would.

    Keep ``webhook_threads`` above ``TOLLGATE["WEBHOOK_MAX_IN_FLIGHT_PER_USER"]`` (docs/design.md#webhooks).
    """
    run_queues = set(RUN_QUEUES) | ({quarantine_queue()} if quarantine_queue() else set())
    return (dramatiq.Worker(broker, queues=run_queues, worker_threads=run_threads,
                            worker_timeout=WORKER_TIMEOUT_MS),
            dramatiq.Worker(broker, queues={WEBHOOK_QUEUE}, worker_threads=webhook_threads,
                            worker_timeout=WORKER_TIMEOUT_MS))


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
    """Runs ``recover_runs.sweep_all`` (every sweep job, in order) every ``interval_s`` seconds until ``stop()``."""

    def __init__(self, interval_s: float):
        super().__init__(name="tollgate-sweeper", daemon=True)
        self.interval_s = interval_s
        self._stopped = threading.Event()

    def run(self):
        while not self._stopped.wait(self.interval_s):
            sweep_all()  # logs a failed pass itself: it never ends the sweeper

    def stop(self):
        self._stopped.set()


class BodyLimitedRunserver(DaphneRunserver):
    """Daphne's ``runserver`` serving with ``BodyLimitedServer`` (request bodies limited, 413)."""

    server_cls = BodyLimitedServer


class Command(BaseCommand):
    help = ("Serve Tollgate (HTTP + WebSockets + static files). Without REDIS_URL, also run "
            "the Dramatiq workers (runs, webhooks) and the sweeper in this process.")

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000",
                            help="Address and port to listen on (default 127.0.0.1:8000).")
        parser.add_argument("--worker-threads", type=int, default=RUN_THREADS,
                            help="Threads of the in-process worker that advances runs (embedded shape only).")
        parser.add_argument("--webhook-threads", type=int, default=WEBHOOK_THREADS,
                            help="Threads of the in-process worker that sends webhook deliveries (embedded shape "
                                 "only; keep it above TOLLGATE_WEBHOOK_MAX_IN_FLIGHT_PER_USER).")
        parser.add_argument("--no-services", action="store_true",
                            help="Do not start the services installed apps add (e.g. the demo payment gateway).")

    def handle(self, *args, addrport, worker_threads, webhook_threads, no_services, **options):
        try:
            require_secret_key()  # before anything starts
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        broker = dramatiq.get_broker()
        workers, sweeper = (), None
        stops = [] if no_services else start_services(sender=self.__class__, stdout=self.stdout)
        if isinstance(broker, StubBroker):
            workers = embedded_workers(broker, run_threads=worker_threads, webhook_threads=webhook_threads)
            for worker in workers:
                worker.start()
            self.stdout.write(f"In-process Dramatiq workers started: runs ({worker_threads} threads), "
                              f"webhooks ({webhook_threads} threads).")
            requeued = requeue_active_runs()
            if requeued:
                self.stdout.write(f"Re-enqueued {len(requeued)} unfinished run(s): {requeued}")
            sweeper = Sweeper(settings.TOLLGATE["SWEEP_INTERVAL_S"])
            sweeper.start()
        else:
            self.stdout.write(f"Broker {type(broker).__name__}: serving only; run workers with "
                              "`manage.py rundramatiq` and the sweeper with `manage.py recover_runs --loop`.")
        try:
            call_command(BodyLimitedRunserver(), addrport, use_reloader=False, use_static_handler=False)
        finally:
            for stop in reversed(stops):
                stop()
            if sweeper is not None:
                sweeper.stop()
            if workers:
                self.stdout.write("Stopping the in-process workers...")
            for worker in workers:
                worker.stop()
