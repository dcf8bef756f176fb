"""``manage.py demo``: load or reset the demo shop, agents and users."""

from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from tools.demo_data import USERS, load_demo

DEMO_LEDGER = Path(settings.BASE_DIR) / "var" / "gateway-ledger.sqlite3"


def reset_demo_gateway() -> str:
    """Empty the demo payment gateway's ledger (running at ``GATEWAY_URL``, or its file); say what was done."""
    try:
        httpx.post(f"{settings.GATEWAY_URL.rstrip('/')}/reset", timeout=2).raise_for_status()
        return f"emptied the ledger of the gateway at {settings.GATEWAY_URL}"
    except httpx.HTTPError:
        if DEMO_LEDGER.exists():
            DEMO_LEDGER.unlink()
            return f"removed {DEMO_LEDGER}"
        return "no gateway ledger to reset"


class Command(BaseCommand):
    help = "Load (or reset) the demo shop, demo agents, demo users and the demo gateway's refunds. Safe to rerun."

    def handle(self, *args, **options):
        passwords = load_demo()
        self.stdout.write(self.style.SUCCESS("Demo data loaded. Users:"))
        for username, password in passwords.items():
            token, _ = Token.objects.get_or_create(user=get_user_model().objects.get(username=username))
            self.stdout.write(f"  {username:<10} password: {password:<16} API token: {token.key}  "
                              f"({USERS[username][1]})")
        self.stdout.write(f"Payment gateway: {reset_demo_gateway()}.")
        self.stdout.write("The demo agents are scripted: 'refund-order' refunds 80.00 of order 123 (needs approval), "
                          "'cancel-order' tries to cancel shipped order 124 (refused), 'send-contract-email' "
                          "sends after a legal check (needs approval). They do not read what you type.")

