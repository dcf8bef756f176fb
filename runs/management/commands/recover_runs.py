"""``manage.py recover_runs``: one sweeper pass, or ``--loop`` for a sweeper process.

A pass sweeps runs (``runs.engine.recovery.sweep``), then webhooks
(``runs.webhooks.services.sweep_webhooks``: the outbox, and deliveries
whose wake-up was lost or whose worker died). In a loop (here, and in
``serve``'s embedded sweeper) one failing does not stop the other.
"""

import logging
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from runs import live, process_metrics
from runs.engine.recovery import sweep
from runs.webhooks.services import sweep_webhooks

log = logging.getLogger(__name__)
PASSES = (("runs", sweep), ("webhooks", sweep_webhooks))


def sweep_all() -> dict:
    """One pass of every sweeper (runs, then webhooks); returns their counts. A pass that fails is logged and
    skipped. Each pass is counted in ``/metrics`` with what it did (``runs.process_metrics.sweeper_pass``)."""
    counts = {}
    for job, one_pass in PASSES:
        done = None
        try:
            done = one_pass()
            counts.update(done)
        except Exception:  # one failed pass (database restarting, ...) must not stop the others or the sweeper
            log.exception("%s failed", one_pass.__name__)
        finally:
            process_metrics.sweeper_pass(job, done)
            close_old_connections()
    return counts


class Command(BaseCommand):
    help = ("Recover stranded runs: re-enqueue runs whose worker died or whose message was lost, "
            "wake waiting runs whose wake_at passed, expire overdue approvals; send webhook deliveries "
            "nobody is sending. One pass, or --loop.")

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="Sweep forever, every SWEEP_INTERVAL_S seconds.")

    def handle(self, *args, loop=False, **options):
        if not loop:
            counts = {**sweep(), **sweep_webhooks()}
            live.flush()  # the pass's pushes go out before the process exits
            self.stdout.write(" ".join(f"{k}={v}" for k, v in counts.items()))
            return
        while True:
            sweep_all()
            time.sleep(settings.TOLLGATE["SWEEP_INTERVAL_S"])
