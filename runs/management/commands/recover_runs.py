"""``manage.py recover_runs``: one sweeper pass, or ``--loop`` for a sweeper process.

A pass runs every registered sweep job in order (``runs.sweeping``: the
engine's, then other apps' such as the webhooks' backstop). In a loop (here,
and in ``serve``'s embedded sweeper) a job that fails is logged and the
others still run; a single pass stops at the first error.
"""

import time

from django.conf import settings
from django.core.management.base import BaseCommand

from runs import live
from runs.base import process_metrics
from runs.sweeping import JobResult, run_sweep, sweep


def sweep_all() -> list[JobResult]:
    """One pass of a long-lived sweeper (``run_sweep(keep_going=True)``); one result per job, failed ones marked.

    Each job's pass is counted in ``/metrics`` with what it did (``runs.base.process_metrics.sweeper_pass``).
    """
    results = run_sweep(keep_going=True)
    for result in results:
        process_metrics.sweeper_pass(result.name, None if result.failed else result.counts)
    return results


class Command(BaseCommand):
    help = ("Recover stranded runs: re-enqueue runs whose worker died or whose message was lost, "
            "wake waiting runs whose wake_at passed, expire overdue approvals, and every other "
            "registered sweep job (webhook deliveries nobody is sending, ...). One pass, or --loop.")

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="Sweep forever, every SWEEP_INTERVAL_S seconds.")

    def handle(self, *args, loop=False, **options):
        if not loop:
            counts = sweep()
            live.flush()  # the pass's pushes go out before the process exits
            self.stdout.write(" ".join(f"{k}={v}" for k, v in counts.items()))
            return
        while True:
            sweep_all()
            time.sleep(settings.TOLLGATE["SWEEP_INTERVAL_S"])
