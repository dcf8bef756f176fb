"""Issue 27: a demo you can repeat.

``manage.py demo`` runs from a new shell (no ``SECRET_KEY``) as a real
subprocess, logs nobody out unless ``--reset-passwords`` says so, and
resets the demo orders without emptying the payment gateway's ledger:
after a reset a person's "Refund order" run on order 123 is paid again,
and the inbox's summary and the order lookup count the same refunds.
"""

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from approvals.models import Interrupt
from runs.models import Run
from tests.demo.support import gateway_refunds
from tests.support.api import get_run, pending_interrupts, start_run
from tests.demo.gateway import GatewayProcess
from tests.support.processes import database_url_for_subprocess
from tools.demo import gateway
from tools.demo.models import CONTESTED_ORDER
from tools.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
OWN_PASSWORD = "a-passphrase-of-my-own-42"


@pytest.fixture(autouse=True)
def production_hasher(settings):
    """Let this process check the passwords ``manage.py demo`` hashed (the suite itself hashes with MD5)."""
    settings.PASSWORD_HASHERS = [*settings.PASSWORD_HASHERS, "django.contrib.auth.hashers.PBKDF2PasswordHasher"]


def manage_demo_in_a_new_shell(*args: str, gateway_url: str) -> str:
    """Run ``manage.py demo`` in the environment of a new shell (no SECRET_KEY, no DEBUG); return its output."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "DATABASE_URL": database_url_for_subprocess(), "GATEWAY_URL": gateway_url}
    result = subprocess.run([sys.executable, "manage.py", "demo", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    return result.stdout


def log_in(username: str, password: str) -> Client:
    """A browser-like client logged in through the login page (a real session cookie)."""
    client = Client()
    response = client.post(reverse("login"), {"username": username, "password": password})
    assert response.status_code == 302, f"{username} could not log in"
    return client


def logged_in_user(client: Client) -> str | None:
    """Who the client's session cookie logs in, judged by the inbox page (None: sent to the login page)."""
    response = client.get(reverse("inbox"))
    if response.status_code == 302:
        assert response["Location"].startswith(reverse("login"))
        return None
    assert response.status_code == 200
    return response.wsgi_request.user.username


def test_demo_runs_twice_from_a_new_shell_and_logs_nobody_out_unless_told(payment_gateway):
    created = manage_demo_in_a_new_shell(gateway_url=payment_gateway.url)
    assert "approver-demo" in created and "requester-demo" in created  # new users get their known passwords
    approver = get_user_model().objects.get(username="approver")
    approver.set_password(OWN_PASSWORD)  # a person who chose a password of their own
    approver.save()
    browser = log_in("approver", OWN_PASSWORD)

    for _ in range(2):
        output = manage_demo_in_a_new_shell(gateway_url=payment_gateway.url)
        assert logged_in_user(browser) == "approver"
        assert "approver-demo" not in output and "(unchanged)" in output and "API token" in output
    assert get_user_model().objects.get(username="approver").check_password(OWN_PASSWORD)

    output = manage_demo_in_a_new_shell("--reset-passwords", gateway_url=payment_gateway.url)
    assert "approver-demo" in output
    assert logged_in_user(browser) is None  # a new password ends the log-ins made with the old one
    assert logged_in_user(log_in("approver", "approver-demo")) == "approver"


def test_demo_changes_nothing_in_a_gateway_it_does_not_own(tmp_path):
    """Another program's gateway answers at GATEWAY_URL, with refunds of its own: the demo leaves it as it was."""
    theirs = GatewayProcess(tmp_path)
    theirs.start()
    try:
        refund = httpx.post(f"{theirs.url}/refunds", json={"order_id": 7, "amount": "12.50"},
                            headers={"Idempotency-Key": "their-refund-1"}, timeout=5)
        assert refund.status_code == 201
        before = httpx.get(f"{theirs.url}/ledger", timeout=5).json()

        output = manage_demo_in_a_new_shell(gateway_url=theirs.url)

        assert httpx.get(f"{theirs.url}/ledger", timeout=5).json() == before
        assert [r["idempotency_key"] for r in before["refunds"]] == ["their-refund-1"]
        assert f"The payment gateway at {theirs.url} was not contacted" in output
    finally:
        theirs.stop()


def _start_refund(requester: Client) -> Run:
    response = requester.post(reverse("run-start"), {"agent": "refund-order", "input": "Refund my order, please."})
    assert response.status_code == 302
    return Run.objects.latest("id")


def _lookup(run: Run) -> dict:
    return ToolCall.objects.get(run=run, name="query_order").result


def test_a_person_refunds_order_123_again_after_a_reset_and_summary_and_lookup_agree(payment_gateway, worker):
    manage_demo_in_a_new_shell(gateway_url=payment_gateway.url)
    requester, approver = log_in("requester", "requester-demo"), log_in("approver", "approver-demo")

    first = _start_refund(requester)
    worker.drain()
    approver.post(reverse("inbox-item", args=[Interrupt.objects.get(run=first).pk]), {"decision": "approved"})
    worker.drain()
    first.refresh_from_db()
    assert (first.status, first.outcome) == ("completed", "achieved")

    second = _start_refund(requester)  # order 123 has 40.00 left: the gate refuses a second 80.00
    worker.drain()
    second.refresh_from_db()
    assert (second.status, second.outcome) == ("completed", "not_achieved")
    refused = ToolCall.objects.get(run=second, name="refund")
    assert refused.status == "denied" and "at most 40.00 can be refunded" in str(refused.error)
    assert _lookup(second)["refunded"] == "80.00"
    assert not Interrupt.objects.filter(run=second).exists()

    manage_demo_in_a_new_shell(gateway_url=payment_gateway.url)  # the reset, while both stay logged in
    assert [r["order_id"] for r in gateway.ledger()["refunds"]] == [123]  # the gateway's ledger is not emptied

    third = _start_refund(requester)
    worker.drain()
    assert (_lookup(third)["refunded"], _lookup(third)["refundable_amount"]) == ("0.00", "120.00")
    item = Interrupt.objects.get(run=third)
    inbox = approver.get(reverse("inbox")).content.decode()
    assert "Refund 80.00 on order 123 (total 120.00, refunded 0.00)" in inbox
    page = approver.get(reverse("inbox-item", args=[item.pk])).content.decode()
    assert "refunded 0.00" in page and "refunded 80.00" not in page
    approver.post(reverse("inbox-item", args=[item.pk]), {"decision": "approved"})
    worker.drain()
    third.refresh_from_db()
    assert (third.status, third.outcome) == ("completed", "achieved")
    assert [r["order_id"] for r in gateway.ledger()["refunds"]] == [123, 123]


def test_refund_next_order_finds_a_fresh_order_on_every_try_and_leaves_the_contested_one(worker, demo, api):
    requester, approver = api(demo["requester"]), api(demo["approver"])
    refunded = []
    for _ in range(3):
        run = start_run(requester, "refund-next-order", "Refund my latest order.")
        worker.drain()
        item, = pending_interrupts(approver, run["id"])  # 60.00 is over 50: a person approves it
        assert approver.post(f"/api/interrupts/{item['id']}/approve/", {}, format="json").status_code == 200
        worker.drain()
        finished = get_run(requester, run["id"])
        assert finished["outcome"] == "achieved", finished
        order = ToolCall.objects.get(run_id=run["id"], name="refund").arguments["order_id"]
        assert finished["final_output"] == f"A refund of 60.00 for order {order} has been issued."
        refunded.append(order)

    assert len(set(refunded)) == 3 and CONTESTED_ORDER not in refunded
    assert refunded == sorted(refunded, reverse=True)  # the newest order with room first
    assert sorted(r["order_id"] for r in gateway_refunds()) == sorted(refunded)


def test_two_refund_next_order_runs_waiting_together_pick_different_orders(worker, demo, api):
    requester = api(demo["requester"])
    first, second = (start_run(requester, "refund-next-order", "Refund.") for _ in range(2))
    worker.drain()
    orders = {ToolCall.objects.get(run_id=run["id"], name="refund").arguments["order_id"] for run in (first, second)}
    assert len(orders) == 2  # the first's refund, awaiting approval, already counts on its order
