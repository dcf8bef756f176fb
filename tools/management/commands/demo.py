from django.core.management.base import BaseCommand

from tools.demo_data import USERS, load_demo


class Command(BaseCommand):
    help = "Load (or reset) the demo shop, demo agents and demo users. Safe to run again."

    def handle(self, *args, **options):
        passwords = load_demo()
        self.stdout.write(self.style.SUCCESS("Demo data loaded. Users:"))
        for username, password in passwords.items():
            self.stdout.write(f"  {username:<10} password: {password:<16} ({USERS[username][1]})")
