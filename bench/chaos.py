"""Chaos run: refunds under worker SIGKILLs, a faulty payment gateway and restarts of Redis and PostgreSQL.

Production shape only (PostgreSQL + Redis): set ``DATABASE_URL`` and
``REDIS_URL`` (``bash bench/run.sh chaos ...`` starts private ones). The
harness migrates that database, creates one order and one scripted refund
agent per run (refund 60.00: needs approval; told that no refund was
issued, it refunds again, see ``refund_turns``), starts the payment gateway
with injected timeouts-after-commit and 5xx (and ``--gateway-latency``
seconds on every refund, so a worker holds many runs in flight), starts
``--workers`` ``manage.py rundramatiq`` process groups and one sweeper
(``manage.py recover_runs --loop``), creates ``--runs`` runs, approves
every approval item as the ``approver`` user (and settles any
reconciliation item by looking the key up in the gateway's ledger, as a
person would), and SIGKILLs a worker group at random intervals
(restarting it) until ``--kills`` kills are done. With ``--min-held N`` a
kill waits for a group holding at least N run leases (counted in the
database, by the lease owner's process id) and the figures say how many
runs each kill held.

Poison runs: ``--poison-percent P`` makes P % of the ``--runs`` runs (mixed
in among the others) refund through an agent whose refund kills its worker
every time it starts (a failpoint; each poison run has its own agent and
order); ``--crash-runs N`` adds N such runs on top. Those runs must end ``failed/crash_loop`` in bounded time with no
charge, while the others complete; worker groups that die this way are
restarted, as an operator's supervisor would.

Restarts: ``--restart-redis`` and ``--restart-postgres`` stop the server
and start it again (same port, same data directory, down for
``--outage-s`` seconds), Redis after a third of the kills, PostgreSQL
after two thirds. The harness needs to know the servers: PostgreSQL from
``BENCH_PG_BIN``, ``BENCH_PG_DATA``, ``BENCH_PG_LOG`` and
``BENCH_PG_OS_USER``; Redis from ``REDIS_URL`` (its port) and
``BENCH_REDIS_DIR`` (``bench/run.sh`` sets them all). Redis keeps nothing
on disk (``--save ''``, no AOF, as ``tests/services.sh`` starts it), so
its restart loses every queued and delayed message: the sweeper must send
them again. The workers and the sweeper are not restarted for either
restart: they must ride through it on their own (the figures count only
the worker groups restarted after a SIGKILL or a poison run's death).

Then it waits for every run to settle and prints the figures. Exit code 0
only if no run was lost, no refund was charged twice and every poison run
ended ``failed/crash_loop``.

Short (CI): ``python bench/chaos.py --runs 20 --kills 3``.
Raised:     ``bash bench/run.sh chaos --runs 5000 --kills 50 --min-held 100 --poison-percent 5
--restart-redis --restart-postgres --gateway-latency 2 --quarantine-workers 3 --burst --amount 20
--settle-timeout 2700 --deadline-s 2700``.

``--burst`` creates every run before any worker starts: the workers then
take the whole backlog at once, each holding hundreds of runs (otherwise
runs finish about as fast as the harness creates them, and no group ever
holds a hundred).

Quarantine workers: ``--quarantine-workers N`` starts N more worker groups
on a queue of their own for suspects (``TOLLGATE_QUARANTINE_QUEUE``), the
``--workers`` groups then taking the default queue only, so that a
regular group never empties itself for a suspect and holds its hundreds
of runs between deaths.
"""

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import Cluster, free_port, healthy, require_postgres_and_redis, wait_for  # noqa: E402


def parse_args(argv=None):
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs in all (poison runs of --poison-percent included)")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="worker process groups")
    parser.add_argument("--quarantine-workers", type=int, default=0, metavar="N",
                        help="worker process groups of their own for suspects (TOLLGATE_QUARANTINE_QUEUE), "
                             "besides --workers (which then take the default queue only); 0: none, each "
                             "worker quarantines its own suspects")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker")
    parser.add_argument("--kill-every", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN_S", "MAX_S"))
    parser.add_argument("--burst", action="store_true",
                        help="create every run before any worker starts, so that the workers take the backlog "
                             "at once and each holds hundreds of runs (with --min-held: kills from the start)")
    parser.add_argument("--min-held", type=int, default=0,
                        help="kill a worker group only while it holds at least this many run leases")
    parser.add_argument("--p-timeout", type=float, default=0.05, help="gateway timeout-after-commit probability")
    parser.add_argument("--p-5xx", type=float, default=0.05, help="gateway 503-before-commit probability")
    parser.add_argument("--gateway-latency", type=float, default=0.0, help="seconds the gateway takes per refund")
    parser.add_argument("--settle-timeout", type=float, default=300.0, help="seconds to wait after the last kill")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--crash-runs", type=int, default=0,
                        help="extra runs whose refund kills its worker on every attempt")
    parser.add_argument("--poison-percent", type=float, default=0.0,
                        help="share of --runs (in %%) whose refund kills its worker on every attempt")
    parser.add_argument("--restart-redis", action="store_true", help="restart Redis once, after a third of the kills")
    parser.add_argument("--restart-postgres", action="store_true",
                        help="restart PostgreSQL once, after two thirds of the kills")
    parser.add_argument("--outage-s", type=float, default=3.0, help="seconds a restarted server stays down")
    parser.add_argument("--amount", type=int, default=60,
                        help="refund of each (non-poison) run, on an order of 100: over 50 an approver must "
                             "approve it (default 60); 50 or less starts it at once, so runs pile up in flight")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="stop killing and waiting this many seconds after the drive began, and audit "
                             "(runs not settled by then count as lost); restarts come by a quarter and a half "
                             "of it at the latest")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    if not require_postgres_and_redis("chaos"):
        return 2
    servers = Servers.from_environment()
    missing = servers.missing(redis=args.restart_redis, postgres=args.restart_postgres)
    if missing:
        print(f"chaos: restarting needs {', '.join(missing)} (bash bench/run.sh chaos sets them)", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    poison = round(args.runs * args.poison_percent / 100)
    gateway_port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
        "GATEWAY_TIMEOUT_S": str(1.0 + args.gateway_latency),
        "TOLLGATE_LEASE_TTL_S": "3",
        "TOLLGATE_SWEEP_INTERVAL_S": "1",
        "TOLLGATE_QUEUED_GRACE_S": "5",
        "TOLLGATE_RECONCILE_BACKOFF_S": "0.5",
        "TOLLGATE_RECONCILE_MAX_TRIES": "8",
        # Each poison run has an agent (and an order) of its own, so poison runs do not queue for one
        # order's refund (one side effect at a time per target) but die as they come.
        "TOLLGATE_FAILPOINTS": ",".join(f"tool_call_started:agent={crasher_slug(k)}"
                                        for k in range(poison + args.crash_runs)),
        "TOLLGATE_QUARANTINE_QUEUE": QUARANTINE_QUEUE if args.quarantine_workers else "",
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
    queues = ["default"] * args.workers + [QUARANTINE_QUEUE] * args.quarantine_workers
    cluster = Cluster(env, len(queues), args.threads, log_dir, queues=queues if args.quarantine_workers else None)
    # Stopped from outside (timeout, Ctrl-C): still tear the cluster down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    try:
        cluster.start_gateway(gateway_port)
        wait_for(lambda: healthy(f"{env['GATEWAY_URL']}/health"), 10, "gateway")
        httpx.post(f"{env['GATEWAY_URL']}/faults", json={
            "p_timeout_after_commit": args.p_timeout, "p_error_before_commit": args.p_5xx, "hang_s": 2.0,
            "latency_s": args.gateway_latency,
        }).raise_for_status()
        if not args.burst:
            start_workers(cluster)
        run_ids, crash_ids = create_mixed_runs(args.runs - poison, poison, amount=args.amount)
        crash_ids += create_crashing_runs(args.crash_runs, first=poison)
        figures = {"seconds_creating_runs": round(time.monotonic() - began, 1)}
        if args.burst:
            start_workers(cluster)
        figures.update(drive(cluster, run_ids + crash_ids, args, rng, env["GATEWAY_URL"], servers))
        figures.update(audit(run_ids, env["GATEWAY_URL"]))
        figures.update(audit_crashing(crash_ids))
    finally:
        cluster.stop()
    figures["seconds_wall"] = round(time.monotonic() - began, 1)
    print_figures(figures, log_dir)
    return 0 if figures["lost_runs"] == 0 and figures["refunds_charged_twice"] == 0 \
        and figures["max_charges_per_key"] <= 1 and figures["crash_runs_not_crash_loop"] == 0 else 1


def start_workers(cluster: Cluster) -> None:
    """Every worker group and the sweeper."""
    for index in range(len(cluster.workers)):
        cluster.start_worker(index)
    cluster.start_sweeper()


class Servers:
    """How to stop and start the PostgreSQL and Redis servers the run uses (see the module's docstring)."""

    def __init__(self, *, pg_bin, pg_data, pg_log, pg_os_user, redis_port, redis_dir):
        self.pg_bin, self.pg_data, self.pg_log, self.pg_os_user = pg_bin, pg_data, pg_log, pg_os_user
        self.redis_port, self.redis_dir = redis_port, redis_dir
        self.redis_process: subprocess.Popen | None = None

    @classmethod
    def from_environment(cls) -> "Servers":
        """From ``BENCH_PG_BIN``, ``BENCH_PG_DATA``, ``BENCH_PG_LOG``, ``BENCH_PG_OS_USER``, ``REDIS_URL``
        and ``BENCH_REDIS_DIR``."""
        get = os.environ.get
        return cls(pg_bin=get("BENCH_PG_BIN"), pg_data=get("BENCH_PG_DATA"), pg_log=get("BENCH_PG_LOG"),
                   pg_os_user=get("BENCH_PG_OS_USER"), redis_port=urlparse(get("REDIS_URL", "")).port,
                   redis_dir=get("BENCH_REDIS_DIR"))

    def missing(self, *, redis: bool, postgres: bool) -> list[str]:
        """The environment variables a requested restart needs and does not have."""
        needed = {}
        if postgres:
            needed.update(BENCH_PG_BIN=self.pg_bin, BENCH_PG_DATA=self.pg_data, BENCH_PG_LOG=self.pg_log)
        if redis:
            needed.update(BENCH_REDIS_DIR=self.redis_dir)
        return [name for name, value in needed.items() if not value]

    def _as_pg(self, *command: str) -> list[str]:
        if os.geteuid() == 0 and self.pg_os_user and self.pg_os_user != "root":
            return ["runuser", "-u", self.pg_os_user, "--", *command]
        return list(command)

    def restart_postgres(self, outage_s: float) -> float:
        """Stop PostgreSQL (``pg_ctl stop -m fast``: its sessions are cut off), wait ``outage_s``, start
        it again on the same data directory and port; returns the seconds it was unreachable."""
        pg_ctl = str(Path(self.pg_bin) / "pg_ctl")
        stopped = time.monotonic()
        subprocess.run(self._as_pg(pg_ctl, "-D", self.pg_data, "-m", "fast", "-w", "stop"), check=True,
                       cwd="/", stdout=subprocess.DEVNULL)
        time.sleep(outage_s)
        subprocess.run(self._as_pg(pg_ctl, "-D", self.pg_data, "-l", self.pg_log, "-w", "-t", "60", "start"),
                       check=True, cwd="/", stdout=subprocess.DEVNULL)
        return time.monotonic() - stopped

    def restart_redis(self, outage_s: float) -> float:
        """Shut Redis down (nothing saved: every message is lost), wait ``outage_s``, start it again with
        the flags ``tests/services.sh`` uses; returns the seconds it was unreachable."""
        stopped = time.monotonic()
        subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.redis_port), "shutdown", "nosave"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: not self._redis_answers(), 10, "Redis shutdown")
        time.sleep(outage_s)
        log = Path(self.redis_dir).parent / "redis.log"
        self.redis_process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port), "--save", "", "--appendonly",
             "no", "--daemonize", "no", "--dir", self.redis_dir, "--logfile", str(log)],
            stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._redis_answers, 10, "Redis")
        return time.monotonic() - stopped

    def _redis_answers(self) -> bool:
        answer = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.redis_port), "ping"],
                                capture_output=True, text=True)
        return answer.stdout.strip() == "PONG"


def new_order_and_agent(requester, number: int, amount: int = 60):
    """Order ``number`` (total 100.00, of ``requester``) and its refund agent (``refund_turns``)."""
    from runs.models import Agent
    from tools.demo.models import Order

    Order.objects.create(number=number, owner=requester, total=Decimal("100.00"))
    return Agent.objects.create(
        slug=f"chaos-{number}", name=f"chaos {number}", tools=["query_order", "refund"], completion_check="refund",
        model={"provider": "scripted", "turns": refund_turns(number, amount)},
    )


def refund_turns(number: int, amount: int) -> list[dict]:
    """The refund agent's script: look order ``number`` up, refund ``amount`` on it, say so; then, for each
    reminder the run may get (``MAX_INCOMPLETE_NUDGES``, as this process's settings have it: the workers
    inherit its environment, so theirs is the same), refund again and say so.

    The injected faults can make a refund end ``failed`` with nothing charged (every send refused before the
    charge, the key then unknown to the gateway); the refund check then says no refund was issued, and the
    run's next model call answers that reminder as a model would, with a new refund (a new call and key).
    Without those turns the run would fail ``model_error`` for want of a turn, though nothing was lost or
    charged. A refund settled ``failed`` that did charge is still caught: the order is charged twice, or the
    refund's precondition denies the new one and the charge has no succeeded call.
    """
    from django.conf import settings

    refund = {"tool_calls": [{"name": "refund", "arguments": {"order_id": number, "amount": amount}}]}
    said = {"content": f"Refunded {amount}.00 on order {number}."}
    return [{"tool_calls": [{"name": "query_order", "arguments": {"order_id": number}}]}, refund, said] \
        + [refund, said] * settings.TOLLGATE["MAX_INCOMPLETE_NUDGES"]


def create_mixed_runs(count: int, poison: int, amount: int = 60) -> tuple[list[int], list[int]]:
    """``count`` refund runs (per run, one order of total 100.00 and one agent refunding ``amount``, default
    60.00, of it) and ``poison`` crashing runs (as ``create_crashing_runs``), started in one sequence with the
    poison runs spread evenly among the others; returns both id lists (refund runs, crashing runs)."""
    from django.contrib.auth import get_user_model

    from runs.engine.lifecycle import start_run

    requester = get_user_model().objects.get(username="requester")
    stamp = int(time.time()) % 100_000 * 10_000
    run_ids, crash_ids = [], []
    total = count + poison
    for i in range(total):
        # Poison run k goes at position ~ (k + 0.5) * total / poison.
        if len(crash_ids) < poison and (i + 0.5) >= (len(crash_ids) + 0.5) * total / poison:
            k = len(crash_ids)
            crash_ids.append(start_run(agent=_crasher_agent(requester, k), user=requester, input=f"crash {k}").pk)
            continue
        number = 1_000_000_000 + stamp + len(run_ids)
        agent = new_order_and_agent(requester, number, amount)
        run_ids.append(start_run(agent=agent, user=requester, input=f"refund order {number}").pk)
    return run_ids, crash_ids


CRASHER = "chaos-crasher"


def crasher_slug(k: int) -> str:
    """The slug of poison run ``k``'s agent (the failpoint names it)."""
    return f"{CRASHER}-{k}"


def _crasher_agent(requester, k: int):
    """Poison run ``k``'s agent, whose refund (of an order of its own) kills the worker whenever it starts."""
    from runs.models import Agent
    from tools.demo.models import Order

    number = 900_000_000 + k
    Order.objects.update_or_create(number=number, defaults={"owner": requester, "total": Decimal("100.00")})
    agent, _ = Agent.objects.update_or_create(slug=crasher_slug(k), defaults={
        "name": f"chaos crasher {k}", "tools": ["refund"], "completion_check": "default",
        "model": {"provider": "scripted", "turns": [
            {"tool_calls": [{"name": "refund", "arguments": {"order_id": number, "amount": 60}}]},
            {"content": "Refunded."},
        ]},
    })
    return agent


def create_crashing_runs(count: int, first: int = 0) -> list[int]:
    """``count`` poison runs (numbered from ``first``), each of an agent whose refund kills the worker
    whenever it starts."""
    from django.contrib.auth import get_user_model

    from runs.engine.lifecycle import start_run

    requester = get_user_model().objects.get(username="requester")
    return [start_run(agent=_crasher_agent(requester, k), user=requester, input=f"crash {k}").pk
            for k in range(first, first + count)]


def audit_crashing(run_ids: list[int]) -> dict:
    """How the runs whose refund always kills its worker ended, and how long after their approval."""
    from approvals.models import Interrupt
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
    approved = dict(Interrupt.objects.filter(run_id__in=run_ids, kind="approval", resolved_at__isnull=False)
                    .values_list("run_id", "resolved_at"))
    to_end = [(run.finished_at - approved[run.pk]).total_seconds() for run in runs
              if run.finished_at is not None and run.pk in approved]
    return {
        "crash_runs_created": len(run_ids),
        "crash_runs_ended": dict(Counter(f"{r.status}/{r.failure_type or r.outcome}" for r in runs)),
        "crash_runs_not_crash_loop": runs.exclude(status="failed", failure_type="crash_loop").count(),
        "crash_runs_seconds_approved_to_ended": _spread(to_end),
        "crash_runs_max_refund_attempts": max(calls.values_list("attempts", flat=True), default=0),
        "crash_runs_max_blamed_refund_attempts": max((call.attempts - spared[call.pk] for call in calls), default=0),
        "crash_runs_lost_leases": sum(runs.values_list("lost_leases", flat=True)),
    }


def _spread(values) -> str:
    """``min/median/max`` of ``values`` (one decimal), or ``-`` when there are none."""
    if not values:
        return "-"
    return "/".join(f"{v:.1f}" if isinstance(v, float) else str(v)
                    for v in (min(values), statistics.median(values), max(values)))


def approve_pending(approver, run_ids: list[int], limit: int | None = None) -> int:
    """Approve pending approval items of these runs (the oldest ``limit``, default all), as a person would;
    returns how many."""
    from django_fsm import TransitionNotAllowed

    from approvals.models import Interrupt
    from approvals.services import decide_interrupt

    approved = 0
    for item in Interrupt.objects.filter(run_id__in=run_ids, status="pending", kind="approval").order_by("pk")[:limit]:
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
    """Runs not yet terminal (waiting ones included: the approver will approve them)."""
    from runs.models import Run

    return Run.objects.filter(pk__in=run_ids, status__in=["queued", "running", "waiting"]).count()


def _descendants(pid: int) -> set[int]:
    """The pids of ``pid``'s living descendants, from ``/proc`` (Linux; no third-party module, so the
    short run needs only the test dependencies)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (name)": state, ppid, ...
        except OSError:
            continue  # ended meanwhile
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def leases_held(cluster: Cluster) -> list[int]:
    """Run leases each worker group holds now (unexpired leases whose owner is one of its processes)."""
    from django.utils import timezone

    from runs.models import Run

    per_pid = Counter()
    for owner in Run.objects.filter(lease_expires_at__gt=timezone.now()).values_list("lease_owner", flat=True):
        parts = owner.split(":")  # host:pid:nonce (runs.lease.WORKER_ID)
        if len(parts) >= 3 and parts[-2].isdigit():
            per_pid[int(parts[-2])] += 1
    held = []
    for process in cluster.workers:
        pids = set()
        if process is not None and process.poll() is None:
            pids = {process.pid} | _descendants(process.pid)
        held.append(sum(per_pid[pid] for pid in pids))
    return held


def _tolerating_outages(step, fallback=None):
    """``step()``; a database or Redis error (a server restarting) is printed, the connection dropped and
    ``fallback`` returned, so the harness outlives the restarts it makes."""
    import httpx
    import redis
    from django.db import DatabaseError, connection

    try:
        return step()
    except (DatabaseError, redis.RedisError, httpx.TransportError) as exc:
        print(f"chaos: {type(exc).__name__} in the driver ({str(exc).strip()[:120]}); going on", file=sys.stderr)
        connection.close()
        time.sleep(0.5)
        return fallback


class Supervisor:
    """A thread that restarts every worker group that died by itself (a poison run's failpoint), within
    ``every_s`` seconds, as an operator's process supervisor would; ``lock`` is held around each restart
    and must be held by whoever else kills or starts worker groups."""

    def __init__(self, cluster: Cluster, every_s: float = 0.2):
        self.cluster, self.every_s = cluster, every_s
        self.lock = threading.Lock()
        self.revived = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            with self.lock:
                self.revived += self.cluster.revive()

    def stop(self) -> None:
        """Stop watching (the cluster is about to be torn down)."""
        self._stop.set()
        self._thread.join()


# The suspects' queue of --quarantine-workers.
QUARANTINE_QUEUE = "quarantine"
# Approval items decided per turn of the driver's loop, so that kills and restarts are not held up by a
# backlog of thousands.
APPROVALS_PER_TURN = 200


def drive(cluster: Cluster, run_ids: list[int], args, rng: random.Random, gateway_url: str,
          servers: Servers) -> dict:
    """Approve, kill and restart workers (and Redis and PostgreSQL once) until the kills are done; then wait
    for the runs to settle. Returns the figures of the drive."""
    supervisor = Supervisor(cluster)
    try:
        return _drive(cluster, supervisor, run_ids, args, rng, gateway_url, servers)
    finally:
        supervisor.stop()


def _drive(cluster: Cluster, supervisor: Supervisor, run_ids: list[int], args, rng: random.Random,
           gateway_url: str, servers: Servers) -> dict:
    from django.contrib.auth import get_user_model

    approver = get_user_model().objects.get(username="approver")
    kills, held_per_kill, restarts = 0, [], {}
    restart_at = {}
    if args.restart_redis:
        restart_at["redis"] = max(1, args.kills // 3)
    if args.restart_postgres:
        restart_at["postgres"] = max(1, 2 * args.kills // 3)
    next_kill = time.monotonic() + rng.uniform(*args.kill_every)
    started = time.monotonic()
    last_kill = started
    deadline_at = started + args.deadline_s if args.deadline_s else float("inf")
    restart_by = {"redis": started + (args.deadline_s or float("inf")) / 4,
                  "postgres": started + (args.deadline_s or float("inf")) / 2}

    def tend():
        approve_pending(approver, run_ids, APPROVALS_PER_TURN)
        reconcile_pending(approver, run_ids, gateway_url)

    while kills < args.kills and time.monotonic() < deadline_at:
        _tolerating_outages(tend)
        for server, at in list(restart_at.items()):
            if kills >= at or time.monotonic() >= restart_by[server]:
                down = servers.restart_redis(args.outage_s) if server == "redis" else \
                    servers.restart_postgres(args.outage_s)
                restarts[server] = f"after kill {kills}, {time.monotonic() - started:.1f} s in, down {down:.1f} s"
                print(f"chaos: {server} restarted {restarts[server]}", file=sys.stderr)
                del restart_at[server]
        if time.monotonic() >= next_kill:
            held = _tolerating_outages(lambda: leases_held(cluster), [])
            # The regular groups: a quarantine group's deaths are the poison runs' own.
            targets = [i for i, n in enumerate(held[:args.workers]) if n >= args.min_held]
            victim = rng.choice(targets) if targets else None
            with supervisor.lock:
                if victim is not None and cluster.workers[victim].poll() is None:  # not died meanwhile
                    cluster.kill_worker(victim)
                    kills += 1
                    held_per_kill.append(held[victim])
                    print(f"chaos: kill {kills}: worker group {victim} holding {held[victim]} runs", file=sys.stderr)
                    last_kill = time.monotonic()
                    time.sleep(0.3)
                    cluster.start_worker(victim)
                    next_kill = time.monotonic() + rng.uniform(*args.kill_every)
            if victim is None and not _tolerating_outages(lambda: unsettled(run_ids), 1):
                print(f"chaos: every run settled after {kills} kills; no more kills", file=sys.stderr)
                break
        time.sleep(0.1)
    deadline = min(time.monotonic() + args.settle_timeout, deadline_at)
    while _tolerating_outages(lambda: unsettled(run_ids), 1) and time.monotonic() < deadline:
        _tolerating_outages(tend)
        time.sleep(0.2)
    settled_at = time.monotonic()
    return {"kills": kills, "runs_held_per_kill": _spread(held_per_kill),
            "runs_held_per_kill_all": held_per_kill,
            "redis_restart": restarts.get("redis", "-"), "postgres_restart": restarts.get("postgres", "-"),
            "worker_groups_revived": supervisor.revived, "seconds_total": round(settled_at - started, 1),
            "seconds_last_kill_to_settled": round(settled_at - last_kill, 1),
            "stopped_at_deadline": settled_at >= deadline_at}


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
        "runs_lost_leases_max": max(runs.values_list("lost_leases", flat=True), default=0),
        "runs_seconds_created_to_ended": _spread([(end - start).total_seconds() for start, end in runs.filter(
            finished_at__isnull=False).values_list("created_at", "finished_at")]),
        "runs_not_completed_why": _why_not_completed(runs.exclude(status="completed").exclude(
            status="failed", failure_type="crash_loop")),
    }


def _why_not_completed(runs, limit: int = 5) -> dict:
    """For the first ``limit`` of ``runs`` (by id): its state and error, and each of its tool calls' name, status,
    attempts (sends not sent, reconciliation tries) and error, so that a failing chaos run says what went wrong."""
    from tools.models import ToolCall

    why = {}
    for run in runs.order_by("pk")[:limit]:
        calls = [f"{c.name} {c.status} attempts={c.attempts} unsent={c.unsent_attempts} "
                 f"reconciled={c.reconcile_attempts} {c.error[:160]!r}"
                 for c in ToolCall.objects.filter(run=run).order_by("pk")]
        why[run.pk] = f"{run.status}/{run.failure_type or run.outcome or run.waiting_reason}: {run.error[:200]!r}; " \
                      + "; ".join(calls)
    return why


def print_figures(figures: dict, log_dir: Path) -> None:
    """Print ``figures`` one ``  key: value`` line each (tests/engine/test_chaos.py reads them), then the log folder."""
    print("chaos figures")
    for key, value in figures.items():
        print(f"  {key}: {value}")
    print(f"  logs: {log_dir}")


if __name__ == "__main__":
    sys.exit(main())
