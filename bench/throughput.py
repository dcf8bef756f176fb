"""Throughput of one fixed durable workload: Tollgate side by side with LangGraph + PostgresSaver.

One run = 5 model calls + 4 tool calls with a scripted model:
``query_order`` three times (read-only), then ``refund`` of 60.00 on an
order of 100.00 (a side effect whose approval rule asks a person), then a
final answer. A *step* is one model call or one tool execution, so a run
is 9 steps. ``--runs`` runs are created at once.

Tollgate (needs ``DATABASE_URL`` = PostgreSQL and ``REDIS_URL``, like
bench/chaos.py): the harness migrates that database, loads the demo users,
starts the demo payment gateway, an API server (Daphne, as in production),
``--workers`` ``manage.py rundramatiq`` process groups of ``--threads``
threads and one sweeper, creates one order and one scripted agent per run,
then starts the runs (``runs.engine.lifecycle.start_run``, in this process, all in
a row). An approver thread watches the database for new approval items and
approves each one through the REST API (``POST
/api/interrupts/<id>/approve/``, token auth, real HTTP) as soon as it
appears. When every run has ended it prints:

* runs/s and steps/s, from the first run's creation to the last run's end;
* database statements per step, from ``pg_stat_statements`` (reset before
  the runs are created), split by process kind when the database role may
  create login roles (each kind then connects as its own role), and
  transactions per step from ``pg_stat_database`` (``xact_commit`` +
  ``xact_rollback`` deltas of the whole database, every client included);
* CPU seconds per step (printed in ms) of the workers, the API server, the
  sweeper, the gateway, this driver, PostgreSQL (the postmaster and every
  backend, when its pid is known: ``BENCH_POSTGRES_PID``, or the data
  directory's ``postmaster.pid`` if readable) and Redis (``INFO cpu``), from
  psutil (``/proc``), counting exited child processes too;
* p50/p99 latencies from the stored timestamps: run creation
  (``Run.created_at``) -> first model call (``Step.started_at``); approval
  POST sent (this driver's clock) -> refund start (``ToolCall.started_at``);
  tool result (``ToolCall.finished_at``) -> next model call; and the
  approval POST round trip; the same latencies again for ``--serial-runs``
  runs started one at a time afterwards (the system not saturated);
* how many runs the sweeper re-enqueued until the burst ended (its log lines).

LangGraph (``pip install -e '.[bench]'``): the same workload as a graph with
a scripted model node and a tools node, checkpointed by ``PostgresSaver``
in the same database with ``durability="sync"`` (every step's checkpoint is
committed before the next step starts). ``query_order`` reads the order row
and asks the gateway what was refunded; ``refund`` calls ``interrupt()``
for the approval, which the same process gives at once by resuming with
``Command(resume=...)``, then checks what is refundable and refunds through
the gateway with an idempotency key. It runs once per number in
``--langgraph-processes``, each process taking its share of the runs one
after another, and prints runs/s, steps/s, CPU per step and the ratio
Tollgate / LangGraph (steps/s) for each.

Example: ``python bench/throughput.py --runs 100 --workers 2 --threads 4 --langgraph-processes 1 2``
(``bash bench/run.sh ...`` starts a private PostgreSQL + Redis first).
Not a test: nothing here asserts a speed.
"""

import argparse
import json
import multiprocessing
import os
import re
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import (  # noqa: E402
    Cluster, free_port, healthy, prepare_django, require_postgres_and_redis, wait_for, without_collector_pauses)

STEPS_PER_RUN = 9  # 5 model calls + 4 tool executions
ORDER_TOTAL = Decimal("100.00")
REFUND_AMOUNT = 60  # over 50 on one order: the refund rule asks for approval
PROCESS_KINDS = ("worker", "api", "sweeper")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs created at once (default 200)")
    parser.add_argument("--workers", type=int, default=2, help="rundramatiq worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker process (default 4)")
    parser.add_argument("--langgraph-processes", type=int, nargs="*", default=None, metavar="P",
                        help="LangGraph process counts to measure (default: the same as --workers); none: skip")
    parser.add_argument("--serial-runs", type=int, default=20,
                        help="after the burst, runs started one at a time on the idle cluster, for the latencies "
                             "of a system that is not saturated (default 20; 0: none)")
    parser.add_argument("--approvers", type=int, default=4, help="threads sending approval POSTs (default 4)")
    parser.add_argument("--poll-s", type=float, default=0.02,
                        help="seconds between two looks for new approval items (default 0.02)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds to wait for the runs of one side to end (default 900)")
    parser.add_argument("--skip-tollgate", action="store_true", help="measure LangGraph only")
    parser.add_argument("--top-statements", type=int, default=0, metavar="N",
                        help="also print the N statements the workers sent most often, per step (default 0: none)")
    return parser.parse_args()


# --- measuring ---------------------------------------------------------------

def percentile(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100) of ``values``, linearly interpolated; None when empty."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1] if p < 100 else max(values)


def process_tree(pid: int | None) -> list:
    """``psutil.Process`` objects of ``pid`` and its descendants; empty when it is gone or not readable."""
    import psutil

    if not pid:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by process ``pid``, its descendants and their exited children.

    0.0 when the process is gone or not readable.
    """
    import psutil

    total = 0.0
    for process in process_tree(pid):
        try:
            t = process.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def redis_cpu_s(redis_url: str) -> float:
    """CPU seconds Redis has used (``INFO cpu``: main thread and children, user + system)."""
    import redis

    info = redis.Redis.from_url(redis_url).info("cpu")
    return sum(float(info.get(k, 0)) for k in ("used_cpu_user", "used_cpu_sys",
                                               "used_cpu_user_children", "used_cpu_sys_children"))


def postgres_pid() -> int | None:
    """The postmaster's pid: ``BENCH_POSTGRES_PID``, else the data directory's ``postmaster.pid`` if readable."""
    if os.environ.get("BENCH_POSTGRES_PID"):
        return int(os.environ["BENCH_POSTGRES_PID"])
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            data_dir = cursor.fetchone()[0]
        return int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    except Exception:  # not a superuser, another machine, not readable: no PostgreSQL figure
        return None


class Database:
    """Counters of the benchmark database: statements (``pg_stat_statements``) and transactions."""

    def __init__(self):
        from django.db import connection

        self.connection = connection
        self.statements = self._try("CREATE EXTENSION IF NOT EXISTS pg_stat_statements") and \
            self._try("SELECT pg_stat_statements_reset()")

    def _try(self, sql: str) -> bool:
        from django.db import DatabaseError

        try:
            with self.connection.cursor() as cursor:
                cursor.execute(sql)
            return True
        except DatabaseError:
            return False

    def reset(self) -> None:
        if self.statements:
            self._try("SELECT pg_stat_statements_reset()")

    def transactions(self) -> int:
        """Committed plus rolled-back transactions of this database so far (every client)."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = current_database()")
            return cursor.fetchone()[0]

    def statements_by_role(self) -> dict[str, dict[str, int]]:
        """``{role: {"all": n, "data": n}}`` since the last reset: every statement, and SELECT/INSERT/UPDATE/DELETE."""
        if not self.statements:
            return {}
        with self.connection.cursor() as cursor:
            cursor.execute("""
                SELECT r.rolname, sum(s.calls),
                       sum(s.calls) FILTER (WHERE s.query ~* '^\\s*(with|select|insert|update|delete)\\M')
                FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
                WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                GROUP BY r.rolname""")
            return {role: {"all": int(n), "data": int(data or 0)} for role, n, data in cursor.fetchall()}

    def top_statements(self, role_suffix: str, limit: int) -> list[tuple[int, str]]:
        """The ``limit`` statements sent most often by the roles whose name ends in ``role_suffix``, as
        ``(calls, query text)``, most calls first; empty without ``pg_stat_statements``."""
        if not self.statements or limit <= 0:
            return []
        with self.connection.cursor() as cursor:
            cursor.execute("""
                SELECT sum(s.calls), s.query FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
                WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND r.rolname LIKE %s
                GROUP BY s.query ORDER BY 1 DESC LIMIT %s""", ["%" + role_suffix, limit])
            return [(int(calls), query) for calls, query in cursor.fetchall()]


def role_urls(database_url: str) -> dict[str, str]:
    """One login role per process kind (member of the current role), so statements can be told apart.

    Returns ``{kind: DATABASE_URL}``; every kind gets ``database_url`` itself
    when roles cannot be created here (no CREATEROLE).
    """
    from django.db import DatabaseError, connection

    urls = {kind: database_url for kind in PROCESS_KINDS}
    parts = urlparse(database_url)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            owner = cursor.fetchone()[0]
            for kind in PROCESS_KINDS:
                role, password = f"{owner}_bench_{kind}", secrets.token_hex(16)
                cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
                verb = "ALTER" if cursor.fetchone() else "CREATE"
                # Inlined: a utility statement takes no bound parameter under server-side binding (hex: no quote).
                cursor.execute(f"{verb} ROLE \"{role}\" LOGIN PASSWORD '{password}'")
                cursor.execute(f'GRANT "{owner}" TO "{role}"')
                netloc = f"{role}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
                urls[kind] = urlunparse(parts._replace(netloc=netloc))
    except DatabaseError as exc:
        print(f"throughput: no role per process kind ({exc.__class__.__name__}); statements are counted in total",
              file=sys.stderr)
        return {kind: database_url for kind in PROCESS_KINDS}
    return urls


# --- Tollgate ----------------------------------------------------------------

def next_order_number() -> int:
    """An order number above every existing one (and above the demo shop's)."""
    from django.db.models import Max

    from tools.demo.models import Order

    return max(Order.objects.aggregate(n=Max("number"))["n"] or 0, 1_000_000) + 1


def create_agents(count: int) -> list[tuple[int, object]]:
    """One order (100.00) and one scripted agent per run; returns ``[(order number, agent)]``.

    The scripted model does not read the input, so each run's order is in its agent's turns.
    """
    from django.contrib.auth import get_user_model

    from runs.models import Agent
    from tools.demo.models import Order

    requester = get_user_model().objects.get(username="requester")
    base = next_order_number()
    made = []
    for i in range(count):
        number = base + i
        Order.objects.create(number=number, owner=requester, total=ORDER_TOTAL)
        query = {"tool_calls": [{"name": "query_order", "arguments": {"order_id": number}}]}
        agent = Agent.objects.create(
            slug=f"bench-{number}", name=f"bench {number}", tools=["query_order", "refund"],
            completion_check="refund",
            model={"provider": "scripted", "turns": [
                query, query, query,
                {"tool_calls": [{"name": "refund", "arguments": {"order_id": number, "amount": REFUND_AMOUNT}}]},
                {"content": f"Refunded {REFUND_AMOUNT}.00 on order {number}."},
            ]},
        )
        made.append((number, agent))
    return made


class Approver:
    """Approves every approval item of the given runs through the REST API as soon as it appears.

    A watcher thread looks for new pending items every ``poll_s`` seconds
    (one query); ``threads`` threads send the POSTs. ``posts`` maps an item
    id to ``(sent, answered, status code)`` (epoch seconds).

    The look is cheap on purpose, as this driver shares the machine (and
    PostgreSQL) with what it measures: it reads the pending approval items
    of runs from the first of ``run_ids`` on (run ids only grow), by the
    inbox's own index, and leaves out in Python those of other runs and
    those already seen. Naming every run and every item seen in the query
    (two lists of up to ``--runs`` values) made PostgreSQL plan a statement
    of a new shape at every look.
    """

    def __init__(self, api_url: str, token: str, run_ids: list[int], threads: int, poll_s: float):
        import httpx

        self.client = httpx.Client(base_url=api_url, headers={"Authorization": f"Token {token}"}, timeout=60,
                                   limits=httpx.Limits(max_connections=threads))
        self.run_ids = run_ids
        self.poll_s = poll_s
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="approve")
        self.posts: dict[int, tuple[float, float, int]] = {}
        self.seen: set[int] = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="approval-watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.pool.shutdown(wait=True)
        self.client.close()

    def _watch(self) -> None:
        from django.db import close_old_connections

        from approvals.models import Interrupt

        try:
            while not self.stopped.wait(self.poll_s):
                if not self.run_ids:
                    continue
                ours = set(self.run_ids)
                pending = Interrupt.objects.filter(status="pending", kind="approval", run_id__gte=self.run_ids[0]) \
                    .values_list("pk", "run_id")
                for item_id, run_id in pending:
                    if run_id in ours and item_id not in self.seen:
                        self.seen.add(item_id)
                        self.pool.submit(self._approve, item_id)
        finally:
            close_old_connections()

    def _approve(self, item_id: int) -> None:
        sent = time.time()
        response = self.client.post(f"/api/interrupts/{item_id}/approve/", json={"comment": "bench"})
        self.posts[item_id] = (sent, time.time(), response.status_code)


def wait_until_ended(run_ids: list[int], deadline: float, poll_s: float, settled=None) -> None:
    """Look every ``poll_s`` seconds until none of the runs is active or ``time.monotonic()`` passes ``deadline``,
    or, with ``settled`` (a function of the run ids still active), until it answers something true.

    Each look reads the active runs between the lowest and the highest of ``run_ids`` (a range of the
    primary key, one statement of one shape, unsorted) and keeps ``run_ids``' own in Python, rather than naming
    them all: the benchmark's own reads are charged to PostgreSQL's CPU per step, so they are kept cheap.
    """
    from runs.models import TERMINAL_STATUSES, Run

    ours = set(run_ids)
    active = Run.objects.filter(pk__range=(min(ours), max(ours))).exclude(status__in=TERMINAL_STATUSES) \
        .order_by().values_list("pk", flat=True)  # unsorted: the model's ordering would sort every look
    while time.monotonic() < deadline:
        left = ours.intersection(active.all())  # .all(): a fresh read each look
        if not left or (settled is not None and settled(sorted(left))):
            return
        time.sleep(poll_s)


def run_tollgate(args, database: Database) -> dict:
    """Start the cluster, run the workload, return the figures (see the module doc)."""
    import httpx
    import redis
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from runs.engine.lifecycle import start_run

    gateway_port, api_port = urlparse(os.environ["GATEWAY_URL"]).port, free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="tollgate-throughput-"))
    env = dict(os.environ)
    urls = role_urls(os.environ["DATABASE_URL"])
    cluster = Cluster(env, args.workers, args.threads, log_dir)
    try:
        cluster.start_gateway(gateway_port)
        wait_for(lambda: healthy(f"{env['GATEWAY_URL']}/health"), 15, "gateway")
        broker = redis.Redis.from_url(env["REDIS_URL"])
        heartbeats = f"{env['DRAMATIQ_NAMESPACE']}:__heartbeats__"
        broker.delete(heartbeats)  # the bench's own namespace: count only the workers started here
        api = cluster.start_api(api_port, {**env, "DATABASE_URL": urls["api"]})
        workers = [cluster.start_worker(i, {**env, "DATABASE_URL": urls["worker"]}) for i in range(args.workers)]
        sweeper = cluster.start_sweeper({**env, "DATABASE_URL": urls["sweeper"], "LOG_LEVEL": "INFO"})
        api_url = f"http://127.0.0.1:{api_port}"
        wait_for(lambda: healthy(f"{api_url}/accounts/login/"), 60, "API server")
        wait_for(lambda: broker.zcard(heartbeats) >= args.workers, 60, "workers")

        made = create_agents(args.runs + args.serial_runs)
        made, serial = made[:args.runs], made[args.runs:]
        requester = get_user_model().objects.get(username="requester")
        token = Token.objects.get_or_create(user=get_user_model().objects.get(username="approver"))[0].key
        httpx.get(f"{api_url}/api/interrupts/?status=pending", headers={"Authorization": f"Token {token}"},
                  timeout=30).raise_for_status()  # warm the API up

        run_ids: list[int] = []
        approver = Approver(api_url, token, run_ids, args.approvers, args.poll_s)
        pg_pid = postgres_pid()
        pids = {"worker": [w.pid for w in workers], "api": [api.pid], "sweeper": [sweeper.pid],
                "gateway": [cluster.others[0].pid], "postgresql": [pg_pid] if pg_pid else []}
        database.reset()
        cpu_before = {kind: sum(tree_cpu_s(p) for p in plist) for kind, plist in pids.items()}
        cpu_before["redis"] = redis_cpu_s(env["REDIS_URL"])
        cpu_before["driver"] = time.process_time()
        xacts_before = database.transactions()
        approver.start()
        started = time.time()
        for number, agent in made:
            run_ids.append(start_run(agent=agent, user=requester, input=f"refund order {number}").pk)
        created = time.time()
        deadline = time.monotonic() + args.timeout
        wait_until_ended(run_ids, deadline, 0.2)
        ended = time.time()
        cpu_after = {kind: sum(tree_cpu_s(p) for p in plist) for kind, plist in pids.items()}
        cpu_after["redis"] = redis_cpu_s(env["REDIS_URL"])
        cpu_after["driver"] = time.process_time()
        xacts = database.transactions() - xacts_before
        statements = database.statements_by_role()
        top = database.top_statements("_worker", args.top_statements)
        sweeper_log = (log_dir / "sweeper.log").read_text()  # up to the end of the burst
        serial_ids = []
        for number, agent in serial:  # one at a time: each starts when the previous one has ended
            run_ids.append(start_run(agent=agent, user=requester, input=f"refund order {number}").pk)
            serial_ids.append(run_ids[-1])
            wait_until_ended(run_ids[-1:], deadline, 0.02)
        approver.stop()
    finally:
        cluster.stop()
    burst_ids = run_ids[:len(run_ids) - len(serial_ids)]
    figures = tollgate_figures(burst_ids, approver.posts, started, created, ended)
    if serial_ids:
        alone = tollgate_figures(serial_ids, approver.posts, started, created, ended)
        figures["one run at a time afterwards"] = {"runs": alone["runs"], "runs_ended": alone["runs_ended"],
                                                   "latency_ms": alone["latency_ms"]}
    steps = figures["steps"] or 1
    figures["cpu_ms_per_step"] = {kind: round((cpu_after[kind] - cpu_before[kind]) * 1000 / steps, 2)
                                  for kind in cpu_before if kind != "postgresql" or pg_pid}
    figures["transactions_per_step"] = round(xacts / steps, 1)
    figures["statements_per_step"] = statement_figures(statements, urls, steps)
    if top:
        figures["worker statements per step, most frequent"] = [
            f"{calls / steps:.2f} {' '.join(query.split())[:220]}" for calls, query in top]
    figures["sweeper_reenqueued"] = sum(int(n) for n in re.findall(r"reenqueued=(\d+)", sweeper_log))
    figures["logs"] = str(log_dir)
    return figures


def statement_figures(statements: dict, urls: dict, steps: int) -> dict:
    """Statements per step by process kind (``all`` incl. BEGIN/COMMIT/SAVEPOINT; ``data`` only DML/SELECT)."""
    by_kind = {}
    for kind, url in urls.items():
        role = urlparse(url).username
        if role in statements and list(urls.values()).count(url) == 1:
            by_kind[kind] = {k: round(v / steps, 1) for k, v in statements[role].items()}
    total = {k: sum(s[k] for s in statements.values()) for k in ("all", "data")}
    by_kind["every client (incl. this driver)"] = {k: round(v / steps, 1) for k, v in total.items()}
    return by_kind


def tollgate_figures(run_ids: list[int], posts: dict, started: float, created: float, ended: float) -> dict:
    """Throughput and latencies of the runs, from their stored rows."""
    from collections import Counter

    from approvals.models import Interrupt
    from runs.models import Run, Step
    from tools.models import ToolCall

    runs = {r.pk: r for r in Run.objects.filter(pk__in=run_ids)}
    steps = list(Step.objects.filter(run_id__in=run_ids).values("run_id", "index", "status", "started_at"))
    calls = list(ToolCall.objects.filter(run_id__in=run_ids).select_related("step"))
    executed = [c for c in calls if c.started_at is not None]
    model_calls = [s for s in steps if s["status"] == Step.Status.SUCCEEDED]
    step_start = {(s["run_id"], s["index"]): s["started_at"] for s in steps}
    last_end = max((r.finished_at for r in runs.values() if r.finished_at), default=None)
    window = (last_end.timestamp() if last_end else ended) - started

    first_call = [(step_start[(r.pk, 0)] - r.created_at).total_seconds() for r in runs.values()
                  if (r.pk, 0) in step_start]
    result_to_next = [(step_start[(c.run_id, c.step.index + 1)] - c.finished_at).total_seconds() for c in executed
                      if c.finished_at and (c.run_id, c.step.index + 1) in step_start]
    items = {i.pk: i for i in Interrupt.objects.filter(run_id__in=run_ids, kind="approval")}
    post_to_start, round_trip, resolved_to_start = [], [], []
    for item_id, (sent, answered, _code) in posts.items():
        if item_id not in items:
            continue
        round_trip.append(answered - sent)
        call = next((c for c in executed if c.pk == items[item_id].tool_call_id), None)
        if call is not None:
            post_to_start.append(call.started_at.timestamp() - sent)
            resolved_to_start.append((call.started_at - items[item_id].resolved_at).total_seconds())
    finished = [r for r in runs.values() if r.is_terminal]
    step_count = len(model_calls) + len(executed)
    return {
        "runs": len(run_ids),
        "runs_ended": dict(Counter(f"{r.status}/{r.outcome or r.failure_type}" for r in finished)),
        "runs_not_ended": len(run_ids) - len(finished),
        "steps": step_count,
        "model_calls": len(model_calls),
        "tool_executions": len(executed),
        "approval_posts": dict(Counter(code for i, (_s, _a, code) in posts.items() if i in items)),
        "seconds_creating": round(created - started, 2),
        "seconds": round(window, 2),
        "runs_per_s": round(len(finished) / window, 2),
        "steps_per_s": round(step_count / window, 1),
        "latency_ms": {
            "run created -> first model call": p50_p99(first_call),
            "approval POST sent -> refund start": p50_p99(post_to_start),
            "approval POST round trip": p50_p99(round_trip),
            "approval stored (resolved_at) -> refund start": p50_p99(resolved_to_start),
            "tool result -> next model call": p50_p99(result_to_next),
        },
    }


def p50_p99(seconds: list[float]) -> str:
    """``"p50 X, p99 Y (n=N)"`` of durations given in seconds, printed in ms; "n/a" when empty."""
    if not seconds:
        return "n/a"
    return f"p50 {percentile(seconds, 50) * 1000:.0f}, p99 {percentile(seconds, 99) * 1000:.0f} (n={len(seconds)})"


# --- LangGraph ---------------------------------------------------------------

def model_tools_graph(model, tools):
    """The graph of both LangGraph sides: ``model``, then ``tools`` while the last message calls tools, else the end.

    ``model`` and ``tools`` are node functions (plain or ``async``) over
    ``MessagesState``; returns the builder, not compiled.
    """
    from langgraph.graph import END, START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "model")
    return builder


def langgraph_worker(index: int, processes: int, orders: list[int], database_url: str, gateway_url: str,
                     go, results) -> None:
    """One LangGraph process: build the graph, wait for ``go``, run every ``processes``-th run from ``index``.

    Puts ``{"ready": index}`` on ``results`` once the graph is compiled,
    then ``{"runs", "model_calls", "tool_executions", "refunds", "seconds",
    "cpu_s", "started", "ended"}`` (``seconds`` wall clock and ``cpu_s``
    CPU, in seconds; ``started``/``ended`` epoch seconds); any exception
    as ``{"error": text}``.
    """
    try:
        _langgraph_process(index, processes, orders, database_url, gateway_url, go, results)
    except Exception as exc:  # reported by the parent
        import traceback

        results.put({"error": f"{exc!r}\n{traceback.format_exc()}"})


def _langgraph_process(index, processes, orders, database_url, gateway_url, go, results):
    import httpx
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import MessagesState
    from langgraph.types import Command, interrupt
    from psycopg import Connection
    from psycopg.rows import dict_row

    counts = {"model_calls": 0, "tool_executions": 0, "refunds": 0}
    gateway = httpx.Client(base_url=gateway_url, timeout=5)
    shop = Connection.connect(database_url, autocommit=True)

    def refunded(order_id: int) -> Decimal:
        response = gateway.get("/refunds", params={"order_id": order_id})
        response.raise_for_status()
        return Decimal(response.json()["total"])

    def query_order(args: dict) -> dict:
        row = shop.execute("SELECT total, status, shipped FROM demo_order WHERE number = %s",
                           [args["order_id"]]).fetchone()
        if row is None:
            return {"error": "no such order"}
        total, status, shipped = row
        done = refunded(args["order_id"])
        return {"order_id": args["order_id"], "total": str(total), "status": status, "shipped": shipped,
                "refunded": str(done), "refundable_amount": str(total - done)}

    def refund(args: dict, key: str) -> dict:
        decision = interrupt({"tool": "refund", "arguments": args})  # the run waits here for a person
        if not decision.get("approved"):
            return {"error": "rejected"}
        total = shop.execute("SELECT total FROM demo_order WHERE number = %s", [args["order_id"]]).fetchone()[0]
        if Decimal(str(args["amount"])) > total - refunded(args["order_id"]):
            return {"error": "not refundable"}
        response = gateway.post("/refunds", headers={"Idempotency-Key": key},
                                json={"order_id": args["order_id"], "amount": f"{args['amount']:.2f}"})
        response.raise_for_status()
        counts["refunds"] += 1
        return response.json()

    def model(state: MessagesState, config) -> dict:
        """The scripted model: the turn is the number of model answers so far."""
        order_id = config["configurable"]["order_id"]
        turn = sum(isinstance(m, AIMessage) for m in state["messages"])
        counts["model_calls"] += 1
        if turn < 3:
            call = {"name": "query_order", "args": {"order_id": order_id}, "id": f"call_{turn}"}
        elif turn == 3:
            call = {"name": "refund", "args": {"order_id": order_id, "amount": REFUND_AMOUNT}, "id": "call_3"}
        else:
            return {"messages": [AIMessage(content=f"Refunded {REFUND_AMOUNT}.00 on order {order_id}.")]}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def tools(state: MessagesState, config) -> dict:
        out = []
        for call in state["messages"][-1].tool_calls:
            if call["name"] == "refund":
                result = refund(call["args"], f"lg-{config['configurable']['thread_id']}-{call['id']}")
            else:
                result = query_order(call["args"])
            counts["tool_executions"] += 1  # only reached once the tool did its work
            out.append(ToolMessage(content=json.dumps(result), tool_call_id=call["id"], name=call["name"]))
        return {"messages": out}

    builder = model_tools_graph(model, tools)

    with Connection.connect(database_url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        graph = builder.compile(checkpointer=PostgresSaver(conn))
        mine = orders[index::processes]
        results.put({"ready": index})
        go.wait()
        cpu0, t0 = time.process_time(), time.time()
        for order_id in mine:
            config = {"configurable": {"thread_id": str(uuid.uuid4()), "order_id": order_id}}
            state = graph.invoke({"messages": [HumanMessage(f"refund order {order_id}")]}, config, durability="sync")
            while state.get("__interrupt__"):
                state = graph.invoke(Command(resume={"approved": True}), config, durability="sync")
        results.put({"runs": len(mine), **counts, "seconds": time.time() - t0,
                     "cpu_s": time.process_time() - cpu0, "started": t0, "ended": time.time()})
    shop.close()
    gateway.close()


def run_langgraph(args, processes: int, database: Database, gateway_url: str, gateway_pid: int) -> dict:
    """The LangGraph side with ``processes`` processes; returns its figures."""
    from django.contrib.auth import get_user_model
    from langgraph.checkpoint.postgres import PostgresSaver

    from tools.demo.models import Order

    database_url = os.environ["DATABASE_URL"]
    with PostgresSaver.from_conn_string(database_url) as saver:
        saver.setup()  # the checkpoint tables, once
    requester = get_user_model().objects.get(username="requester")
    base = next_order_number()
    orders = [base + i for i in range(args.runs)]
    Order.objects.bulk_create([Order(number=n, owner=requester, total=ORDER_TOTAL) for n in orders])

    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=langgraph_worker,
                            args=(i, processes, orders, database_url, gateway_url, go, results), daemon=True)
                for i in range(processes)]
    for child in children:
        child.start()
    for _ in children:  # imports and graph compilation stay outside the measured window
        ready = results.get(timeout=120)
        if "error" in ready:
            raise RuntimeError(f"LangGraph process failed:\n{ready['error']}")
    pg_pid = postgres_pid()
    database.reset()
    pg_before, gw_before, xacts_before = tree_cpu_s(pg_pid), tree_cpu_s(gateway_pid), database.transactions()
    go.set()
    reports = [results.get(timeout=args.timeout) for _ in children]
    pg_cpu, xacts = tree_cpu_s(pg_pid) - pg_before, database.transactions() - xacts_before
    gw_cpu = tree_cpu_s(gateway_pid) - gw_before
    statements = database.statements_by_role()
    for child in children:
        child.join(timeout=30)
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        raise RuntimeError("LangGraph process failed:\n" + "\n".join(errors))
    window = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    steps = sum(r["model_calls"] + r["tool_executions"] for r in reports)
    cpu = {"langgraph processes": round(sum(r["cpu_s"] for r in reports) * 1000 / steps, 2),
           "gateway": round(gw_cpu * 1000 / steps, 2)}
    if pg_pid:
        cpu["postgresql"] = round(pg_cpu * 1000 / steps, 2)
    return {
        "processes": processes,
        "runs": sum(r["runs"] for r in reports),
        "steps": steps,
        "model_calls": sum(r["model_calls"] for r in reports),
        "tool_executions": sum(r["tool_executions"] for r in reports),
        "refunds_made": sum(r["refunds"] for r in reports),
        "seconds": round(window, 2),
        "runs_per_s": round(sum(r["runs"] for r in reports) / window, 2),
        "steps_per_s": round(steps / window, 1),
        "cpu_ms_per_step": cpu,
        "transactions_per_step": round(xacts / steps, 1),
        "statements_per_step (every client)": {k: round(sum(s[k] for s in statements.values()) / steps, 1)
                                               for k in ("all", "data")} if statements else "n/a",
    }


# --- main ----------------------------------------------------------------------

def print_figures(title: str, figures: dict, indent: str = "  ") -> None:
    print(title)
    for key, value in figures.items():
        if isinstance(value, dict):
            print_figures(f"{indent}{key}:", value, indent + "  ")
        else:
            print(f"{indent}{key}: {value}")


def main() -> int:
    args = parse_args()
    if not require_postgres_and_redis("throughput"):
        return 2
    gateway_port = free_port()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prepare_django("throughput", {"GATEWAY_URL": f"http://127.0.0.1:{gateway_port}"})
    database = Database()
    lg_processes = [args.workers] if args.langgraph_processes is None else args.langgraph_processes

    print(f"throughput: {args.runs} runs of {STEPS_PER_RUN} steps (5 model calls + 4 tool calls), created at once; "
          f"{os.cpu_count()} CPUs; statements counted with "
          f"{'pg_stat_statements' if database.statements else 'nothing (pg_stat_statements unavailable)'}",
          flush=True)
    tollgate = None
    if not args.skip_tollgate:
        tollgate = without_collector_pauses(lambda: run_tollgate(args, database))  # its timings are the driver's
        print_figures(f"Tollgate, {args.workers} worker process(es) x {args.threads} thread(s):", tollgate)
        sys.stdout.flush()
    langgraph = {}
    if lg_processes:
        from bench.cluster import Cluster as _Cluster

        log_dir = Path(tempfile.mkdtemp(prefix="tollgate-throughput-lg-"))
        gateway = _Cluster(dict(os.environ), 0, 1, log_dir)
        try:
            gateway.start_gateway(gateway_port)
            wait_for(lambda: healthy(f"{os.environ['GATEWAY_URL']}/health"), 15, "gateway")
            for processes in lg_processes:
                langgraph[processes] = run_langgraph(args, processes, database, os.environ["GATEWAY_URL"],
                                                     gateway.others[0].pid)
                print_figures(f"LangGraph + PostgresSaver (durability=sync), {processes} process(es):",
                              langgraph[processes])
                sys.stdout.flush()
        finally:
            gateway.stop()
    for processes, other in langgraph.items() if tollgate else ():
        same = " (same number of processes)" if processes == args.workers else ""
        print(f"Tollgate ({args.workers} worker processes) / LangGraph ({processes} processes){same}: steps/s "
              f"{tollgate['steps_per_s']} / {other['steps_per_s']} = "
              f"{tollgate['steps_per_s'] / other['steps_per_s']:.3f}")
    return 0 if not tollgate or tollgate["runs_not_ended"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
