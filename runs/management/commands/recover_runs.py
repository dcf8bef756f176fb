import time

from django.conf import settings
from django.core.management.base import BaseCommand

from runs.recovery import sweep


class Command(BaseCommand):
    help = ("Recover stranded runs: re-enqueue runs whose worker died or whose message was lost, "
            "wake waiting runs whose wake_at passed, expire overdue approvals. One pass, or --loop.")

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="Sweep forever, every SWEEP_INTERVAL_S seconds.")

    def handle(self, *args, loop=False, **options):
        while True:
            counts = sweep()
            self.stdout.write(" ".join(f"{k}={v}" for k, v in counts.items()))
            if not loop:
                return
            time.sleep(settings.TOLLGATE["SWEEP_INTERVAL_S"])
