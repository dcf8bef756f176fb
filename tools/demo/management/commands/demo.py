"""``manage.py demo``: load or reset the demo shop, agents and users.

It prints every demo user's API token and makes ``admin`` a superuser (with
a known password when it creates it or ``--reset-passwords`` says so), so it
refuses a database holding anything but demo data (``--force`` to go on).
Passwords are otherwise left alone: a re-run logs nobody out. It sends
nothing to the payment gateway, whoever runs it: the orders count only the
refunds made since the reset (``Order.refunds_since``), so no ledger, the
one ``serve`` started or another program's, is ever emptied.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token

from runs.models import Agent
from tools.demo import conf
from tools.demo.data import DEMO_AGENTS, DEMO_ORDER_NUMBERS, USERS, load_demo
from tools.demo.models import Order


def non_demo_data() -> list[str]:
    """What in the database is not demo data: users, agents and orders the demo did not make.

    Returns one line per kind found, e.g. ``["2 user(s): alice, bob"]``;
    empty when the database holds demo data only (or nothing).
    """
    found = []
    for label, names in (
        ("user(s)", get_user_model().objects.exclude(username__in=USERS).values_list("username", flat=True)),
        ("agent(s)", Agent.objects.current().exclude(slug__in=[a["slug"] for a in DEMO_AGENTS]).values_list("slug", flat=True)),
        ("order(s)", Order.objects.exclude(number__in=DEMO_ORDER_NUMBERS).values_list("number", flat=True)),
    ):
        names = [str(name) for name in names[:6]]
        if names:
            found.append(f"{label}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}")
    return found


class Command(BaseCommand):
    help = ("Load (or reset) the demo shop, demo agents and demo users; refunds made before it no longer count "
            "against the demo orders. Safe to rerun on a demo database, from any shell, without logging anyone "
            "out; refuses one with other data unless --force.")

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true",
                            help="Load the demo even though the database holds non-demo data (makes 'admin' a "
                                 "superuser and prints the demo users' API tokens).")
        parser.add_argument("--reset-passwords", action="store_true",
                            help="Set the demo users' known passwords again (ends their log-ins). Without it a "
                                 "user that exists keeps its password.")

    def handle(self, *args, force=False, reset_passwords=False, **options):
        other = non_demo_data()
        if other and not force:
            raise CommandError("This database holds data that is not the demo's ("
                               + "; ".join(other) + "). The demo makes 'admin' a superuser and prints API "
                               "tokens: run it on a database of its own, or pass --force.")
        passwords = load_demo(reset_passwords=reset_passwords)
        self.stdout.write(self.style.SUCCESS("Demo data loaded. Users:"))
        for username, password in passwords.items():
            token, _ = Token.objects.get_or_create(user=get_user_model().objects.get(username=username))
            shown = password or "(unchanged)"
            self.stdout.write(f"  {username:<10} password: {shown:<16} API token: {token.key}  "
                              f"({USERS[username][1]})")
        if None in passwords.values():
            self.stdout.write("Passwords left unchanged, so nobody is logged out; --reset-passwords sets the "
                              "known ones again.")
        self.stdout.write("Orders: every demo order is open and refundable in full again (refunds made before now "
                          f"no longer count). The payment gateway at {conf.gateway_url()} was not contacted: this "
                          "command never resets a gateway, so its ledger keeps every refund.")
        self.stdout.write("The demo agents are scripted: 'refund-order' refunds 80.00 of order 123 (needs approval; "
                          "order 123 has room for one such refund, so the next is refused until you run this "
                          "command again), 'cancel-order' tries to cancel shipped order 124 (refused), "
                          "'send-contract-email' sends after a legal check (needs approval). They do not read "
                          "what you type.")
