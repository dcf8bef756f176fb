"""The short chaos run (bench/chaos.py): workers SIGKILLed, gateway faulty, nothing lost or doubled.

Production shape only: it needs PostgreSQL and Redis (several worker
processes share them). The long run is described in README.md.
"""

import os
import re
import subprocess
import sys

import pytest
from django.conf import settings

from tests.support.processes import database_url_for_subprocess

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL") or "postgresql" not in settings.DATABASES["default"]["ENGINE"],
                       reason="the chaos run needs PostgreSQL and Redis"),
]


def _chaos(*arguments: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Run bench/chaos.py with ``arguments`` against the test database; its printed figures (name: text) and
    the finished process."""
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(), "DRAMATIQ_NAMESPACE": "tollgate-chaos"}
    result = subprocess.run([sys.executable, "bench/chaos.py", *arguments], cwd=settings.BASE_DIR, env=env,
                            capture_output=True, text=True, timeout=900)
    print(result.stdout, result.stderr[-3000:])
    return dict(re.findall(r"^  (\w+): (.*)$", result.stdout, re.MULTILINE)), result


def _nothing_lost_or_charged_twice(figures: dict) -> None:
    """The chaos run's promises, as its figures give them: no run lost, no refund charged twice (under one key
    or on one order), no charge without a succeeded call."""
    assert figures["lost_runs"] == "0"
    assert figures["max_charges_per_key"] == "1"
    assert figures["refunds_charged_twice"] == "0"
    assert figures["tool_calls_executed_twice"] == "0"
    assert figures["charges_without_succeeded_call"] == "0"


def test_short_chaos_run_loses_nothing_charges_nothing_twice_and_ends_crash_loops():
    figures, result = _chaos("--runs", "12", "--kills", "3", "--kill-every", "1", "3", "--seed", "3",
                             "--settle-timeout", "240", "--crash-runs", "2")
    assert figures["runs_created"] == "12"
    assert figures["kills"] == "3"
    _nothing_lost_or_charged_twice(figures)
    # Runs whose refund kills its worker every time end failed/crash_loop, within max_attempts sends
    # counted against them (a send cut off by another run's crash, as a bystander, is not).
    assert figures["crash_runs_created"] == "2"
    assert figures["crash_runs_not_crash_loop"] == "0"
    assert int(figures["crash_runs_max_blamed_refund_attempts"]) <= 3
    # Every other run completes: dying beside a crashing run is not held against it.
    assert figures["bystanders_crash_loop"] == "0"
    assert figures["runs_not_completed_otherwise"] == "0"
    assert result.returncode == 0


def test_workers_killed_holding_hundreds_of_runs_each_lose_none_and_charge_none_twice():
    # Refunds of 20 need no approval, and each takes the gateway 3 s: a worker process holds its runs in flight
    # meanwhile. Every run is created before the workers start (--burst), so they take the backlog at once:
    # created one by one on a loaded machine, the runs ended about as fast as they came, no group ever held
    # 100 and nobody was killed. A kill waits until the worker group it picks holds at least 100 run leases.
    figures, result = _chaos("--runs", "300", "--burst", "--amount", "20", "--kills", "2", "--min-held", "100",
                             "--gateway-latency", "3", "--kill-every", "0.5", "1", "--seed", "5",
                             "--settle-timeout", "300")
    assert figures["kills"] == "2"
    assert min(int(held) for held in figures["runs_held_per_kill_all"].strip("[]").split(",")) >= 100
    assert figures["runs_created"] == "300"
    _nothing_lost_or_charged_twice(figures)
    assert figures["runs_not_completed_otherwise"] == "0"
    assert result.returncode == 0
