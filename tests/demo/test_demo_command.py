"""Issue 9, item 6 (safe defaults), the demo's part: ``manage.py demo`` on a real database."""

import os

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_refuses_a_database_with_other_data_unless_forced(demo):
    get_user_model().objects.create_user("alice", password="a-long-and-unusual-passphrase-42")
    with pytest.raises(CommandError, match="alice"):
        call_command("demo", stdout=open(os.devnull, "w"))
    call_command("demo", force=True, stdout=open(os.devnull, "w"))
    get_user_model().objects.filter(username="alice").delete()
    call_command("demo", stdout=open(os.devnull, "w"))  # demo data alone: reloads
