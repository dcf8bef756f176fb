"""``manage.py recover_runs``: one sweeper pass, or ``--loop`` for a sweeper process."""

import logging
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from runs.engine.recovery import sweep

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = ("Recover stranded runs: re-enqueue runs whose worker died or whose message was lost, "
            "wake waiting runs whose wake_at passed, expire overdue approvals. One pass, or --loop.")

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="Sweep forever, every SWEEP_INTERVAL_S seconds.")

    def handle(self, *args, loop=False, **options):
        if not loop:
            counts = sweep()
            self.stdout.write(" ".join(f"{k}={v}" for k, v in counts.items()))
            return
        while True:
            try:
                sweep()
            except Exception:  # one failed pass (database restarting, ...) must not end the sweeper
                log.exception("sweep failed")
            finally:
                close_old_connections()
            time.sleep(settings.TOLLGATE["SWEEP_INTERVAL_S"])
