"""Chaos run: refunds under worker SIGKILLs and a faulty payment gateway.

Production shape only (PostgreSQL + Redis): set ``DATABASE_URL`` and
``REDIS_URL``. The harness migrates that database, creates one order and
one scripted refund agent per run (refund 60.00: needs approval), starts
the payment gateway with injected timeouts-after-commit and 5xx, starts
``--workers`` ``manage.py rundramatiq`` process groups and one sweeper
(``manage.py recover_runs --loop``), creates ``--runs`` runs, approves
every approval item as the ``approver`` user (and settles any
reconciliation item by looking the key up in the gateway's ledger, as a
person would), and SIGKILLs a random worker
group at random intervals (restarting it) until ``--kills`` kills are done.
With ``--crash-runs N``, N more runs refund through an agent whose refund
kills its worker every time it starts (a failpoint): those runs must end
``failed/crash_loop`` in bounded time with no charge, while the others
complete; worker groups that die this way are restarted.
Then it waits for every run to settle and prints the figures. Exit code 0
only if no run was lost and no refund was charged twice.

Short (CI): ``python bench/chaos.py --runs 20 --kills 3``.
Long:       ``python bench/chaos.py --runs 500 --kills 20``.
"""

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import Cluster, free_port, healthy, require_postgres_and_redis, wait_for  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="worker process groups")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker")
    parser.add_argument("--kill-every", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN_S", "MAX_S"))
    parser.add_argument("--p-timeout", type=float, default=0.05, help="gateway timeout-after-commit probability")
    parser.add_argument("--p-5xx", type=float, default=0.05, help="gateway 503-before-commit probability")
    parser.add_argument("--settle-timeout", type=float, default=300.0, help="seconds to wait after the last kill")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--crash-runs", type=int, default=0,
                        help="extra runs whose refund kills its worker on every attempt")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not require_postgres_and_redis("chaos"):
        return 2
    rng = random.Random(args.seed)
    gateway_port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
        "GATEWAY_TIMEOUT_S": "1.0",
        "TOLLGATE_LEASE_TTL_S": "3",
        "TOLLGATE_SWEEP_INTERVAL_S": "1",
        "TOLLGATE_QUEUED_GRACE_S": "5",
        "TOLLGATE_RECONCILE_BACKOFF_S": "0.5",
        "TOLLGATE_RECONCILE_MAX_TRIES": "8",
        "TOLLGATE_FAILPOINTS": f"tool_call_started:agent={CRASHER}",
    }
    os.environ.update(env)

    import django

    django.setup()
    import httpx
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    # The chaos database is the bench's own; earlier chaos runs left their agents and orders.
    call_command("demo", force=True, stdout=open(os.devnull, "w"))

    log_dir = Path(tempfile.mkdtemp(prefix="tollgate-chaos-"))
    cluster = Cluster(env, args.workers, args.threads, log_dir)
    # Stopped from outside (timeout, Ctrl-C): still tear the cluster down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        cluster.start_gateway(gateway_port)
        wait_for(lambda: healthy(f"{env['GATEWAY_URL']}/health"), 10, "gateway")
        httpx.post(f"{env['GATEWAY_URL']}/faults", json={
            "p_timeout_after_commit": args.p_timeout, "p_error_before_commit": args.p_5xx, "hang_s": 2.0,
        }).raise_for_status()
        for index in range(args.workers):
            cluster.start_worker(index)
        cluster.start_sweeper()
        run_ids = create_runs(args.runs)
        crash_ids = create_crashing_runs(args.crash_runs)
        figures = drive(cluster, run_ids + crash_ids, args, rng, env["GATEWAY_URL"])
        figures.update(audit(run_ids, env["GATEWAY_URL"]))
        figures.update(audit_crashing(crash_ids))
    finally:
        cluster.stop()
    print_figures(figures, log_dir)
    return 0 if figures["lost_runs"] == 0 and figures["refunds_charged_twice"] == 0 \
        and figures["max_charges_per_key"] <= 1 and figures["crash_runs_not_crash_loop"] == 0 else 1


def create_runs(count: int) -> list[int]:
    """One order (total 100.00) and one agent refunding 60.00 of it per run; start the runs."""
    from django.contrib.auth import get_user_model

    from runs.models import Agent
    from runs.engine.lifecycle import start_run
    from tools.demo.models import Order

    requester = get_user_model().objects.get(username="requester")
    stamp = int(time.time()) % 100_000 * 10_000
    run_ids = []
    for i in range(count):
        number = 1_000_000_000 + stamp + i
        Order.objects.create(number=number, owner=requester, total=Decimal("100.00"))
        agent = Agent.objects.create(
            slug=f"chaos-{number}", name=f"chaos {number}", tools=["query_order", "refund"], completion_check="refund",
            model={"provider": "scripted", "turns": [
                {"tool_calls": [{"name": "query_order", "arguments": {"order_id": number}}]},
                {"tool_calls": [{"name": "refund", "arguments": {"order_id": number, "amount": 60}}]},
                {"content": f"Refunded 60.00 on order {number}."},
            ]},
        )
        run_ids.append(start_run(agent=agent, user=requester, input=f"refund order {number}").pk)
    return run_ids


CRASHER = "chaos-crasher"


def create_crashing_runs(count: int) -> list[int]:
    """``count`` runs of one agent whose refund (of a shared order) kills the worker whenever it starts."""
    from django.contrib.auth import get_user_model

    from runs.models import Agent
    from runs.engine.lifecycle import start_run
    from tools.demo.models import Order

    if not count:
        return []
    requester = get_user_model().objects.get(username="requester")
    number = 999_999_999
    Order.objects.update_or_create(number=number, defaults={"owner": requester, "total": Decimal("100.00")})
    agent, _ = Agent.objects.update_or_create(slug=CRASHER, defaults={
        "name": "chaos crasher", "tools": ["refund"], "completion_check": "default",
        "model": {"provider": "scripted", "turns": [
            {"tool_calls": [{"name": "refund", "arguments": {"order_id": number, "amount": 60}}]},
            {"content": "Refunded."},
        ]},
    })
    return [start_run(agent=agent, user=requester, input=f"crash {i}").pk for i in range(count)]


def audit_crashing(run_ids: list[int]) -> dict:
    """How the runs whose refund always kills its worker ended."""
    from runs.models import Run, RunEvent
    from tools.models import ToolCall

    runs = Run.objects.filter(pk__in=run_ids)
    calls = ToolCall.objects.filter(run_id__in=run_ids, name="refund")
    # Sends cut off while another run was blamed for the death (a bystander's)
    # are not counted against a call's max_attempts: take them off.
    spared = Counter()
    for event in RunEvent.objects.filter(run_id__in=run_ids, type="recovery"):
        if event.payload.get("blamed") is False:
            spared.update(event.payload.get("tool_calls", []))
    return {
        "crash_runs_created": len(run_ids),
        "crash_runs_ended": dict(Counter(f"{r.status}/{r.failure_type or r.outcome}" for r in runs)),
        "crash_runs_not_crash_loop": runs.exclude(status="failed", failure_type="crash_loop").count(),
        "crash_runs_max_refund_attempts": max(calls.values_list("attempts", flat=True), default=0),
        "crash_runs_max_blamed_refund_attempts": max((call.attempts - spared[call.pk] for call in calls), default=0),
        "crash_runs_lost_leases": sum(runs.values_list("lost_leases", flat=True)),
    }


def approve_pending(approver, run_ids: list[int]) -> int:
    """Approve every pending approval item of these runs, as a person would; returns how many."""
    from django_fsm import TransitionNotAllowed

    from approvals.models import Interrupt
    from approvals.services import decide_interrupt

    approved = 0
    for item in Interrupt.objects.filter(run_id__in=run_ids, status="pending", kind="approval"):
        try:
            decide_interrupt(interrupt=item, user=approver, decision="approved", comment="chaos approver")
            approved += 1
        except TransitionNotAllowed:
            pass
    return approved


def reconcile_pending(approver, run_ids: list[int], gateway_url: str) -> int:
    """Settle reconciliation items as a person would: look the key up in the gateway's ledger."""
    import httpx
    from django_fsm import TransitionNotAllowed

    from approvals.models import Interrupt
    from approvals.services import reconcile_interrupt

    settled = 0
    for item in Interrupt.objects.filter(run_id__in=run_ids, status="pending", kind="reconciliation"):
        key = item.tool_call.idempotency_key
        found = httpx.get(f"{gateway_url}/refunds/{key}", timeout=5)
        try:
            reconcile_interrupt(interrupt=item, user=approver, succeeded=found.status_code == 200,
                                result=found.json() if found.status_code == 200 else None,
                                evidence=f"gateway ledger lookup of {key}: HTTP {found.status_code}")
            settled += 1
        except TransitionNotAllowed:
            pass
    return settled


def unsettled(run_ids: list[int]) -> int:
    """Runs not yet terminal and not waiting for approval (which the approver will give)."""
    from runs.models import Run

    return Run.objects.filter(pk__in=run_ids, status__in=["queued", "running", "waiting"]).count()


def drive(cluster: Cluster, run_ids: list[int], args, rng: random.Random, gateway_url: str) -> dict:
    """Approve, kill and restart workers until the kills are done; then wait for the runs to settle."""
    from django.contrib.auth import get_user_model

    approver = get_user_model().objects.get(username="approver")
    kills = 0
    next_kill = time.monotonic() + rng.uniform(*args.kill_every)
    started = time.monotonic()
    last_kill = started
    revived = 0
    while kills < args.kills:
        revived += cluster.revive()
        approve_pending(approver, run_ids)
        reconcile_pending(approver, run_ids, gateway_url)
        if time.monotonic() >= next_kill:
            victim = rng.randrange(args.workers)
            cluster.kill_worker(victim)
            kills += 1
            last_kill = time.monotonic()
            time.sleep(0.3)
            cluster.start_worker(victim)
            next_kill = time.monotonic() + rng.uniform(*args.kill_every)
        time.sleep(0.1)
    deadline = time.monotonic() + args.settle_timeout
    while unsettled(run_ids) and time.monotonic() < deadline:
        revived += cluster.revive()
        approve_pending(approver, run_ids)
        reconcile_pending(approver, run_ids, gateway_url)
        time.sleep(0.2)
    settled_at = time.monotonic()
    return {"kills": kills, "worker_groups_revived": revived, "seconds_total": round(settled_at - started, 1),
            "seconds_last_kill_to_settled": round(settled_at - last_kill, 1)}


def audit(run_ids: list[int], gateway_url: str) -> dict:
    """Compare the database with the gateway's ledger."""
    import httpx

    from runs.models import Run
    from tools.models import ToolCall

    runs = Run.objects.filter(pk__in=run_ids)
    ledger = httpx.get(f"{gateway_url}/ledger", timeout=10).json()
    charges_per_key = Counter(r["idempotency_key"] for r in ledger["refunds"])
    charges_per_order = Counter(r["order_id"] for r in ledger["refunds"])
    refund_calls = ToolCall.objects.filter(run_id__in=run_ids, name="refund")
    succeeded_keys = set(refund_calls.filter(status="succeeded").values_list("idempotency_key", flat=True))
    return {
        "runs_created": len(run_ids),
        "runs_terminal": dict(Counter(f"{r.status}/{r.outcome or r.failure_type}"
                                      for r in runs.filter(status__in=["completed", "failed", "cancelled"]))),
        "runs_waiting": dict(Counter(runs.filter(status="waiting").values_list("waiting_reason", flat=True))),
        "lost_runs": runs.filter(status__in=["queued", "running"]).count() + (len(run_ids) - runs.count()),
        # Runs that died next to a run whose step kills its worker and were taken for the
        # culprit (the sweeper blames the run whose work started last; see docs/design.md).
        "bystanders_crash_loop": runs.filter(status="failed", failure_type="crash_loop").count(),
        "runs_not_completed_otherwise": runs.exclude(status="completed").exclude(
            status="failed", failure_type="crash_loop").count(),
        "gateway_charges": len(ledger["refunds"]),
        "max_charges_per_key": max(charges_per_key.values(), default=0),
        # Each run makes one logical refund on its own order: a second charge
        # on an order (under any key) is a tool call executed twice.
        "refunds_charged_twice": sum(1 for n in charges_per_order.values() if n > 1),
        "tool_calls_executed_twice": sum(n - 1 for n in charges_per_order.values() if n > 1),
        "charges_without_succeeded_call": len(set(charges_per_key) - succeeded_keys),
        "requests_resent_and_deduplicated": sum(n - 1 for n in ledger["requests_per_key"].values() if n > 1),
        "refund_calls_by_status": dict(Counter(refund_calls.values_list("status", flat=True))),
        "crash_recoveries": refund_calls.filter(attempts__gt=1).count(),
    }


def print_figures(figures: dict, log_dir: Path) -> None:
    print("chaos figures")
    for key, value in figures.items():
        print(f"  {key}: {value}")
    print(f"  logs: {log_dir}")


if __name__ == "__main__":
    sys.exit(main())
