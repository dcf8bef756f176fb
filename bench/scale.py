"""Scale of the waiting set: the inbox, the API lists, one approval and the sweeper with N waiting runs.

Needs ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL`` like bench/chaos.py
(``bash bench/run.sh scale --runs 1000000`` starts private ones). The
harness migrates the database, loads the demo and bulk-inserts ``--runs``
waiting runs (default 1,000,000) with a realistic spread:

* created over the last 30 days, by 50 requesters, on 20 agents;
* 90 % wait for an approval (a pending ``refund``/``send_email`` call and
  its inbox item, expiring over the next 7 days), 4 % for a
  reconciliation (an ``unknown`` call and its item, no expiry), 3 % in
  retry backoff and 3 % on a schedule (``wake_at`` within the next 7 days,
  none due);
* every fourth agent has a deadline (60 days: none passes), so the
  sweeper's deadline check runs as it would.

Rows go in with set-based ``INSERT ... SELECT FROM generate_series`` (every
column not given gets its model field's default, so fields added later
need no change here). Then it measures, in this process with Django's
test client (no network; the server-side time of each request),
``--repeat`` times each, as an approver (who sees every run) and as one of
the 50 requesters (who sees their own):

* the inbox page (``/inbox/``) and the run list page (``/runs/``);
* the API lists in their default order (newest first) with the common
  filters: runs (``status``, ``waiting_reason``, ``agent``), inbox items
  (``status``), sessions, one run's events;
* one approval (``POST /api/interrupts/<id>/approve/``), each on another item;
* one sweeper pass (``runs.sweeping.sweep``) with nothing due, and
  one with ``--due`` (default 50) each of approvals past their expiry,
  retry backoffs past their ``wake_at`` and running runs whose lease
  expired (a dead worker's), made due again before each pass (not timed);

and prints p50/p95 in ms, queries per request, this process's peak RSS
before and after the measurements (flat memory: no growth with N), and with
``--explain`` a summary of ``EXPLAIN (ANALYZE, BUFFERS)`` of the slowest
statement of each (its plan nodes and their actual rows and time).
Not a test: nothing here asserts a speed.
"""

import argparse
import os
import re
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import prepare_django, require_postgres_and_redis  # noqa: E402
from bench.throughput import percentile  # noqa: E402

REQUESTERS = 50
AGENTS = 20
DEADLINE_S = 60 * 86400  # every fourth agent's; none of the runs reaches it


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="waiting runs to insert (default 1,000,000)")
    parser.add_argument("--due", type=int, default=50,
                        help="expired approvals, due backoffs and expired leases per sweeper pass (default 50)")
    parser.add_argument("--repeat", type=int, default=20, help="measurements per figure")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of the slowest statements")
    parser.add_argument("--keep", action="store_true", help="reuse rows a previous invocation inserted")
    parser.add_argument("--skip", action="append", default=[], metavar="TEXT",
                        help="leave out the figures whose title contains TEXT (repeatable), e.g. --skip inbox")
    parser.add_argument("--profile", action="store_true",
                        help="print where one sweeper pass with due work spends its time (cProfile, top 25)")
    return parser.parse_args()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def insert_select(model, count: int, expressions: dict[str, str]) -> int:
    """``INSERT INTO <model's table> SELECT ... FROM generate_series(1, count) AS g``; returns the first id.

    ``expressions`` maps column names to SQL over ``g`` (1..count) and
    ``{base}`` (this insert's first id minus one); every other column gets
    the field's Python default as a parameter, so fields added later need no
    change here. Ids are ``base + g``; the id sequence is moved past them.
    """
    from django.db import connection
    from django.db.models import Max

    table = model._meta.db_table
    base = model.objects.aggregate(top=Max("pk"))["top"] or 0
    columns, values, params = ["id"], ["%s + g" % base], []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(field.column)
        if field.column in expressions:
            values.append(expressions[field.column].format(base=base))
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} "
           f"FROM generate_series(1::bigint, {int(count)}) AS g")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {base + count})")
    return base + 1


def populate(args) -> None:
    """Insert ``args.runs`` waiting runs with their steps, calls and items (see module doc).

    The first M = 94 % of the runs have an item (g mod 94 < 90: an approval
    of a pending call, else a reconciliation of an ``unknown`` one), with
    one step, one call and one item each, so run g, step g, call g and item
    g belong together; the rest wait in a retry backoff or on a schedule.
    Requester, agent, creation time and expiry are spread by hashing g.
    """
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from approvals.models import Interrupt
    from runs.models import Agent, Run, Session, Step
    from tools.models import ToolCall

    users = [get_user_model().objects.get_or_create(username=f"scale-requester-{i}")[0].pk for i in range(REQUESTERS)]
    template = Agent.objects.get(slug="refund-order")
    agents = [Agent.objects.get_or_create(
        slug=f"scale-agent-{i}", defaults={"name": f"Scale agent {i}", "model": template.model,
                                           "tools": template.tools, "approval_policy": template.approval_policy,
                                           "instructions": template.instructions,
                                           "deadline_s": DEADLINE_S if i % 4 == 0 else None})[0].pk
              for i in range(AGENTS)]
    n = args.runs
    with_items = n * 94 // 100
    user_of = f"(ARRAY{users})[1 + mod(g * 7919, {len(users)})]"
    agent_of = f"(ARRAY{agents})[1 + mod(g * 104729, {len(agents)})]"
    created = "now() - (mod(g * 2654435761, 2592000) || ' seconds')::interval"  # over the last 30 days
    later = "now() + ((3600 + mod(g * 40503, 601200)) || ' seconds')::interval"  # 1 hour to 7 days ahead
    approval = "mod(g, 94) < 90"
    started = time.monotonic()
    with transaction.atomic():
        sessions = insert_select(Session, n, {"owner_id": user_of, "agent_id": agent_of, "created_at": created})
        runs = insert_select(Run, n, {
            "session_id": f"{sessions - 1} + g", "agent_id": agent_of, "requested_by_id": user_of,
            "input": "'scale bench'", "status": "'waiting'",
            "waiting_reason": (f"CASE WHEN g > {with_items} THEN (CASE WHEN mod(g, 2) = 0 THEN 'retry_backoff' "
                               f"ELSE 'scheduled' END) WHEN {approval} THEN 'approval' ELSE 'reconciliation' END"),
            "wake_at": f"CASE WHEN g > {with_items} THEN {later} END",
            "created_at": created, "updated_at": created, "started_at": created,
        })
        steps = insert_select(Step, with_items, {"run_id": f"{runs - 1} + g", "index": "0", "status": "'completed'",
                                                 "started_at": created})
        calls = insert_select(ToolCall, with_items, {
            "run_id": f"{runs - 1} + g", "step_id": f"{steps - 1} + g", "index": "0",
            "provider_call_id": "'call-' || g",
            "name": "CASE WHEN mod(g, 3) = 0 THEN 'send_email' ELSE 'refund' END",
            "arguments": ("CASE WHEN mod(g, 3) = 0 THEN jsonb_build_object('to', 'client' || g || '@example.com', "
                          "'subject', 'Contract', 'body', 'Please sign.') ELSE jsonb_build_object('order_id', "
                          "1000 + mod(g, 5000), 'amount', (51 + mod(g, 350)) || '.00') END"),
            "side_effect": "true",
            "status": f"CASE WHEN {approval} THEN 'awaiting_approval' ELSE 'unknown' END",
            "idempotency_key": "'scale-' || g", "created_at": created,
        })
        insert_select(Interrupt, with_items, {
            "run_id": f"{runs - 1} + g", "tool_call_id": f"{calls - 1} + g",
            "kind": f"CASE WHEN {approval} THEN 'approval' ELSE 'reconciliation' END",
            "title": f"CASE WHEN {approval} THEN 'Approve refund?' ELSE 'Did the refund happen?' END",
            "expires_at": f"CASE WHEN {approval} THEN {later} END", "created_at": created,
        })
    print(f"  inserted {n:,} runs ({with_items:,} with a call and an item) in {time.monotonic() - started:.0f} s",
          flush=True)


def make_due(due: int) -> None:
    """Make ``due`` more approvals overdue, ``due`` more backoffs due and ``due`` more leases expired.

    The approvals are pending ones (lowest ids; the approval figure takes the
    highest); the leases are those of runs waiting on a schedule, made
    ``running`` under a worker that is gone (a test of a dead worker's runs).
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("UPDATE approvals_interrupt SET expires_at = now() - interval '1 minute' WHERE id IN "
                       "(SELECT id FROM approvals_interrupt WHERE status = 'pending' AND kind = 'approval' "
                       "ORDER BY id LIMIT %s)", [due])
        cursor.execute("UPDATE runs_run SET wake_at = now() - interval '5 seconds' WHERE id IN "
                       "(SELECT id FROM runs_run WHERE waiting_reason = 'retry_backoff' AND status = 'waiting' "
                       "AND wake_at > now() ORDER BY id LIMIT %s)", [due])
        cursor.execute("UPDATE runs_run SET status = 'running', waiting_reason = '', wake_at = NULL, "
                       "lease_owner = 'scale-dead-worker', lease_token = lease_token + 1, "
                       "lease_expires_at = now() - interval '1 minute' WHERE id IN "
                       "(SELECT id FROM runs_run WHERE waiting_reason = 'scheduled' AND status = 'waiting' "
                       "ORDER BY id LIMIT %s)", [due])


def timed(fn, repeat: int, before_each=None) -> tuple[list[float], list[int], list]:
    """Run ``fn`` ``repeat`` times (``before_each()`` first each time, not timed);
    (ms each, queries each, the captured queries of the slowest)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times, counts, slowest, worst = [], [], [], -1.0
    for i in range(repeat):
        if before_each is not None:
            before_each()
        connection.queries_log.clear()  # it keeps 9,000 at most: counting must not start at that limit
        with CaptureQueriesContext(connection) as captured:
            began = time.perf_counter()
            fn(i)
            spent = (time.perf_counter() - began) * 1000
        times.append(spent)
        counts.append(len(captured.captured_queries))
        if spent > worst:
            worst, slowest = spent, list(captured.captured_queries)
    return times, counts, slowest


PLAN_NODE = re.compile(r"^(\s*)(?:->  )?([A-Z][A-Za-z ]+?(?: using \S+)?(?: on \S+)?)\s+\(cost=[^)]*\)"
                       r"\s+\(actual time=[\d.]+\.\.([\d.]+) rows=(\d+) loops=(\d+)\)")


def explain(queries: list, title: str) -> None:
    """Print a summary of ``EXPLAIN (ANALYZE, BUFFERS)`` of the slowest SELECT in ``queries``:
    each plan node (indented as in the plan) with its actual rows, loops and time, and the execution time."""
    from django.db import connection

    reads = [q for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    if not reads:
        return
    query = max(reads, key=lambda q: float(q["time"]))
    print(f"\n  {title}: slowest statement {float(query['time']) * 1000:.1f} ms: {query['sql'][:160]}...")
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + query["sql"])
        lines = [line for (line,) in cursor.fetchall()]
    for line in lines:
        node = PLAN_NODE.match(line)
        if node:
            indent, name, ms, rows, loops = node.groups()
            print(f"    {' ' * (len(indent) // 3)}{name}: rows {rows} x{loops}, {ms} ms")
        elif line.strip().startswith(("Index Cond", "Filter", "Sort Key", "Execution Time")):
            depth = (len(line) - len(line.lstrip())) // 3
            print(f"    {' ' * depth}  {line.strip()[:150]}")


def measure(args) -> None:
    """Time each figure ``args.repeat`` times and print them (see module doc)."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.utils import timezone
    from rest_framework.test import APIClient

    from approvals.models import Interrupt, InterruptKind, InterruptStatus
    from runs.sweeping import sweep
    from runs.models import Run

    users = get_user_model().objects
    clients = {}
    for who, user in (("approver", users.get(username="approver")), ("requester", users.get(username="scale-requester-7"))):
        page, api = Client(), APIClient()
        page.force_login(user)
        api.force_authenticate(user)
        clients[who] = (page, api)
    pending = list(Interrupt.objects.filter(status=InterruptStatus.PENDING, kind=InterruptKind.APPROVAL,
                                            expires_at__gt=timezone.now()).order_by("-id")
                   .values_list("pk", flat=True)[:args.repeat])
    some_run = Run.objects.filter(input="scale bench").order_by("-id").values_list("pk", flat=True).first()

    def get(who, url, api=True):
        client = clients[who][1 if api else 0]

        def call(_):
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)
        return call

    def approve(i):
        response = clients["approver"][1].post(f"/api/interrupts/{pending[i]}/approve/", {"comment": "scale bench"},
                                               format="json")
        assert response.status_code == 200, response.content[:300]

    done = []

    def sweep_due(_):
        done.append(sweep())  # fewer woken or re-sent once the bench's backoffs or schedules run out

    figures = [
        ("approver: inbox page /inbox/", get("approver", "/inbox/", api=False), None),
        ("approver: run list page /runs/", get("approver", "/runs/", api=False), None),
        ("requester: run list page /runs/", get("requester", "/runs/", api=False), None),
        ("approver: API /api/runs/", get("approver", "/api/runs/"), None),
        ("approver: API /api/runs/?status=waiting", get("approver", "/api/runs/?status=waiting"), None),
        ("approver: API /api/runs/?waiting_reason=reconciliation",
         get("approver", "/api/runs/?waiting_reason=reconciliation"), None),
        ("approver: API /api/runs/?agent=scale-agent-7", get("approver", "/api/runs/?agent=scale-agent-7"), None),
        ("requester: API /api/runs/", get("requester", "/api/runs/"), None),
        ("approver: API /api/interrupts/", get("approver", "/api/interrupts/"), None),
        ("approver: API /api/interrupts/?status=pending", get("approver", "/api/interrupts/?status=pending"), None),
        ("requester: API /api/interrupts/", get("requester", "/api/interrupts/"), None),
        ("approver: API /api/sessions/", get("approver", "/api/sessions/"), None),
        ("requester: API /api/sessions/", get("requester", "/api/sessions/"), None),
        ("approver: API /api/runs/<id>/events/", get("approver", f"/api/runs/{some_run}/events/"), None),
        ("one approval (API POST, committed)", approve, None),
        ("one sweeper pass, nothing due", lambda _: sweep(), None),
        (f"one sweeper pass, {args.due} overdue approvals + {args.due} due backoffs + {args.due} expired leases",
         sweep_due, lambda: make_due(args.due)),
    ]
    sweep()  # what the insert left due (nothing but its own backlog)
    rss_before = peak_rss_mib()
    slowest = {}
    for title, fn, before_each in figures:
        if any(text in title for text in args.skip):
            continue
        if before_each is None and not title.startswith(("one approval", "one sweeper")):
            fn(0)  # warm caches, not counted
        times, counts, queries = timed(fn, args.repeat, before_each)
        slowest[title] = queries
        print(f"  {title}: p50 {percentile(times, 50):.1f} ms, p95 {percentile(times, 95):.1f} ms, "
              f"max {max(times):.1f} ms; {statistics.median(counts):.0f} queries", flush=True)
    if done:
        print(f"  (the passes with due work did, in total: {', '.join(f'{key} {sum(d[key] for d in done)}' for key in done[0])})")
    print(f"  peak RSS of this process: {rss_before:.0f} MiB before the measurements, {peak_rss_mib():.0f} MiB after")
    if args.explain:
        for title, queries in slowest.items():
            explain(queries, title)
    if args.profile:
        profile_sweep(args.due)


def profile_sweep(due: int) -> None:
    """Print the 25 functions with the most cumulative time in one sweeper pass with ``due`` of each kind due."""
    import cProfile
    import pstats

    from runs.sweeping import sweep

    make_due(due)
    profiler = cProfile.Profile()
    profiler.runcall(sweep)
    print(f"\n  one sweeper pass with {due} of each kind due, by cumulative time:")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(25)


def main() -> int:
    args = parse_args()
    if not require_postgres_and_redis("scale"):
        return 2
    prepare_django("scale", {"ALLOWED_HOSTS": "testserver,127.0.0.1"}, demo=False)
    from django.core.management import call_command
    from django.db import connection

    from runs.models import Run

    if not args.keep or not Run.objects.filter(input="scale bench").exists():
        call_command("demo", force=True, stdout=open(os.devnull, "w"))
        print(f"scale: inserting {args.runs:,} waiting runs", flush=True)
        populate(args)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    print(f"scale: {Run.objects.filter(status='waiting').count():,} waiting runs; {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
