"""Runs that wait on a slow model: Tollgate side by side with LangGraph (async) + AsyncPostgresSaver.

The model is ``bench/fake_model_server.py``, an OpenAI-compatible server
(its own process, asyncio) that answers every Chat Completions request
after ``--latency`` seconds (default 1.0), streamed or not as asked. One
run = 3 model calls + 2 tool calls: ``query_order`` (read-only: the order
row and the gateway's ``GET /refunds``), then ``refund`` of ``--amount``
(default 20.00, on an order of 100.00: under the refund rule's 50, so no
approval; the gateway's ``POST /refunds``), then a final text. A *step* is
one model call or one tool execution, so a run is 5 steps. ``--runs``
runs (default 1,000) are started at once, each on its own order.

Tollgate (needs ``DATABASE_URL`` = PostgreSQL and ``REDIS_URL``, like
bench/throughput.py): the harness migrates the database, loads the demo
users, starts the demo payment gateway, the model server, ``--workers``
``manage.py rundramatiq`` process groups of ``--threads`` threads and one
sweeper (no API server: nothing here goes through it), makes one agent
whose model config is ``{"provider": "openai", "endpoint": "bench-latency",
...}`` (the endpoint profile is given to every process in
``TOLLGATE_MODEL_ENDPOINTS``: the model server's ``base_url``, no key),
then starts the runs in this process as an integrator starts many at once:
``runs.engine.lifecycle.start_runs`` (what ``POST /api/runs/batch/`` does) with
``TOLLGATE["RUN_BATCH_MAX"]`` (100) inputs at a time, or, with ``--one-by-one``,
``start_run`` for each, all in a row. ``--runs-in-flight`` sets the engine's runs in
flight per worker process (``TOLLGATE_RUNS_IN_FLIGHT``, default 1,000).

LangGraph (``pip install -e '.[bench]'``): the same work as an async graph
of a model node (``AsyncOpenAI`` against the same model server, streaming
when Tollgate's agent streams; its typed ``chat.completions.create`` over
httpx, or with ``--langgraph-client post`` the request as Tollgate's provider
sends it) and a tools node (async psycopg for the
order row, an ``aiohttp`` session for the gateway as Tollgate's demo tools use, the refund with an
idempotency key), checkpointed by ``AsyncPostgresSaver`` over a
connection pool of ``--langgraph-pool`` connections per process with
``durability="sync"``. It runs once per number in
``--langgraph-processes`` (default 1 2); each process starts its share of
the runs at once (``asyncio.gather``).

Printed for each side:

* runs ended by status/outcome (Tollgate) or achieved/failed (LangGraph:
  achieved = the refund went through and the last message is the final
  text); p50/p99 run duration in ms (Tollgate: ``Run.created_at`` ->
  ``Run.finished_at``; LangGraph: the common start -> the run's end);
* wall time in seconds, from the first run's creation (LangGraph: the
  start) to the last run's end, and steps/s over it;
* the model server's counters: requests, and the most requests in flight
  at once (its ``GET /stats``, reset before each side);
* RSS of the worker processes (Tollgate: each ``rundramatiq`` group with
  its children; LangGraph: each process), sampled every ``--sample-s``
  (0.2) seconds with psutil: idle (just before the runs start, after
  ``--warmup-runs`` Tollgate runs, default workers x threads, and one
  LangGraph run per process, so the modules and connections a run loads
  are in it), peak
  total (the largest sum at one sample) and peak per process, in MiB; the
  sum counts pages shared between a parent and its forked child twice.
  "Memory per run in flight" = (peak total - idle total) / the most model
  requests in flight, in KiB; for Tollgate also the most runs its workers
  held at once (live leases, counted at each sample) and "memory per run
  held" = (total at that sample - idle total) / that count, in KiB: what
  a run the engine holds costs, whether it is in a model call or waits
  for a database thread;
* CPU per step in ms, by process kind (user + system seconds from
  ``/proc`` via psutil, exited children included; PostgreSQL = the
  postmaster and its backends when its pid is known; Redis from ``INFO
  cpu``; the model server, the gateway and this driver too), and
  transactions per step (``pg_stat_database``, every client);

and then the ratio of wall times, Tollgate / LangGraph, for each LangGraph
process count.

Example: ``bash bench/run.sh latency --runs 200 --latency 1.0 --workers 2 --threads 4 --langgraph-processes 1 2``
(``bash bench/run.sh latency ...`` starts a private PostgreSQL + Redis
first). Not a test: nothing here asserts a speed.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import (  # noqa: E402
    Cluster, free_port, healthy, prepare_django, require_postgres_and_redis, wait_for, without_collector_pauses)
from bench.throughput import (  # noqa: E402
    ORDER_TOTAL, Database, model_tools_graph, next_order_number, p50_p99, postgres_pid, print_figures, process_tree,
    redis_cpu_s, tollgate_figures, tree_cpu_s, wait_until_ended)

STEPS_PER_RUN = 5  # 3 model calls + 2 tool executions
ENDPOINT = "bench-latency"  # the endpoint profile of the model server
MODEL_NAME = "bench-latency-model"
RUNS_IN_FLIGHT_VARIABLE = "TOLLGATE_RUNS_IN_FLIGHT"
MIB = 1024 * 1024


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs started at once (default 1000)")
    parser.add_argument("--latency", type=float, default=1.0,
                        help="seconds the model server takes for every answer (default 1.0)")
    parser.add_argument("--workers", type=int, default=2, help="rundramatiq worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=4, help="threads per worker process (default 4)")
    parser.add_argument("--runs-in-flight", type=int, default=None, metavar="N",
                        help=f"runs in flight per worker process, passed in {RUNS_IN_FLIGHT_VARIABLE} "
                             f"(default: the setting's, 1,000)")
    parser.add_argument("--langgraph-processes", type=int, nargs="*", default=[1, 2], metavar="P",
                        help="LangGraph process counts to measure (default 1 2); none: skip")
    parser.add_argument("--langgraph-pool", type=int, default=10,
                        help="PostgreSQL connections per LangGraph process (default 10)")
    parser.add_argument("--langgraph-client", choices=("typed", "post"), default="typed",
                        help="how the LangGraph side calls the model: the SDK's typed chat.completions.create over "
                             "httpx, as its documentation shows (default), or client.post with a plain JSON body over "
                             "the SDK's aiohttp transport, as Tollgate's openai provider does")
    parser.add_argument("--amount", type=float, default=20.0,
                        help="the refund's amount (default 20.0; over 50 the refund rule would ask for approval)")
    parser.add_argument("--no-stream", dest="stream", action="store_false",
                        help="non-streamed model answers on both sides (default: streamed, Tollgate's default)")
    parser.add_argument("--one-by-one", action="store_true",
                        help="start Tollgate's runs one start_run at a time (default: start_runs, 100 at a time)")
    parser.add_argument("--warmup-runs", type=int, default=None, metavar="N",
                        help="Tollgate runs made before the measured ones, so that idle RSS is that of warm workers "
                             "(default: workers x threads); each LangGraph process makes one")
    parser.add_argument("--sample-s", type=float, default=0.2, help="seconds between two RSS samples (default 0.2)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds to wait for the runs of one side to end (default 1800)")
    parser.add_argument("--skip-tollgate", action="store_true", help="measure LangGraph only")
    return parser.parse_args()


# --- measuring ---------------------------------------------------------------

def tree_rss(pid: int) -> int:
    """Resident bytes of process ``pid`` and its descendants (0 when it is gone)."""
    import psutil

    total = 0
    for process in process_tree(pid):
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class RssSampler:
    """Samples the RSS of named process trees every ``interval_s`` seconds in a thread.

    ``idle`` is the sample taken by ``start()`` (bytes per name);
    ``peak_total`` the largest sum over the names at one sample and
    ``peak`` the largest sample per name (bytes), both including ``idle``.
    With ``held`` (a function: how many runs the workers hold in flight now),
    each sample also counts them: ``max_held`` is the most, and
    ``total_at_max_held`` the sum of RSS at that sample (bytes).
    """

    def __init__(self, pids: dict[str, int], interval_s: float, held=None):
        self.pids = pids
        self.interval_s = interval_s
        self.held = held
        self.idle: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.peak_total = 0
        self.max_held = 0
        self.total_at_max_held = 0
        self.samples = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample_until_stopped, name="rss-sampler", daemon=True)

    def sample(self) -> dict[str, int]:
        now = {name: tree_rss(pid) for name, pid in self.pids.items()}
        for name, rss in now.items():
            self.peak[name] = max(self.peak.get(name, 0), rss)
        self.peak_total = max(self.peak_total, sum(now.values()))
        held = self.held() if self.held is not None else 0
        if held > self.max_held:
            self.max_held, self.total_at_max_held = held, sum(now.values())
        self.samples += 1
        return now

    def start(self) -> None:
        self.idle = self.sample()
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.sample()

    def _sample_until_stopped(self) -> None:
        from django.db import connection

        try:
            while not self.stopped.wait(self.interval_s):
                self.sample()
        finally:
            connection.close()  # this thread's, opened by ``held``

    def figures(self, max_in_flight: int) -> dict:
        """Idle and peak RSS in MiB, and (peak - idle) per model request in flight in KiB."""
        idle = sum(self.idle.values())
        grown = self.peak_total - idle
        return {
            "idle total MiB": round(idle / MIB, 1),
            "peak total MiB": round(self.peak_total / MIB, 1),
            "peak per process MiB": {name: round(rss / MIB, 1) for name, rss in self.peak.items()},
            "samples": self.samples,
            "memory per run in flight KiB ((peak - idle) / max model requests in flight)":
                round(grown / 1024 / max_in_flight, 1) if max_in_flight else "n/a",
            **({"max runs held (leases)": self.max_held,
                "memory per run held KiB ((RSS at the most runs held - idle) / the most runs held)":
                    round((self.total_at_max_held - idle) / 1024 / self.max_held, 1)}
               if self.max_held else {}),
        }


class ModelServer:
    """The fake model server's process and its ``/stats``."""

    def __init__(self, cluster: Cluster, port: int, args):
        self.url = f"http://127.0.0.1:{port}"
        self.process = cluster.spawn(["-m", "bench.fake_model_server", "--port", str(port),
                                      "--latency", str(args.latency), "--amount", str(args.amount)],
                                     "model-server")
        cluster.others.append(self.process)
        wait_for(lambda: healthy(f"{self.url}/health"), 15, "model server")

    def reset(self) -> None:
        import httpx

        httpx.post(f"{self.url}/stats/reset", timeout=5).raise_for_status()

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"{self.url}/stats", timeout=5).json()


class CpuMeter:
    """CPU seconds of process trees (by kind), PostgreSQL, Redis and this driver between two readings.

    The first reading is taken when it is made, the second by ``stop()``,
    which must come before the processes exit (their times go with them).
    """

    def __init__(self, pids: dict[str, list[int]], redis_url: str | None):
        self.pids = {kind: plist for kind, plist in pids.items() if plist}
        self.redis_url = redis_url
        self.before = self._read()
        self.after: dict[str, float] = {}

    def stop(self) -> None:
        self.after = self._read()

    def _read(self) -> dict[str, float]:
        now = {kind: sum(tree_cpu_s(p) for p in plist) for kind, plist in self.pids.items()}
        if self.redis_url:
            now["redis"] = redis_cpu_s(self.redis_url)
        now["driver"] = time.process_time()
        return now

    def ms_per_step(self, steps: int) -> dict[str, float]:
        """CPU ms per step between the two readings, by kind."""
        return {kind: round((self.after[kind] - self.before[kind]) * 1000 / (steps or 1), 2) for kind in self.after}


def create_orders(count: int) -> list[int]:
    """``count`` orders of ORDER_TOTAL owned by the demo requester; returns their numbers."""
    from django.contrib.auth import get_user_model

    from tools.demo.models import Order

    requester = get_user_model().objects.get(username="requester")
    base = next_order_number()
    numbers = [base + i for i in range(count)]
    Order.objects.bulk_create([Order(number=n, owner=requester, total=ORDER_TOTAL) for n in numbers])
    return numbers


def side_figures(model_stats: dict, sampler: RssSampler, cpu: dict, transactions: int, steps: int) -> dict:
    """The figures both sides print the same way (model server, memory, CPU, transactions)."""
    return {
        "model requests": model_stats["requests"],
        "model requests answered with an error": model_stats["errors"],
        "max model requests in flight": model_stats["max_in_flight"],
        "worker RSS": sampler.figures(model_stats["max_in_flight"]),
        "cpu_ms_per_step": cpu,
        "transactions_per_step (every client)": round(transactions / (steps or 1), 1),
    }


# --- Tollgate ----------------------------------------------------------------

def run_tollgate(args, database: Database, services: Cluster, model: ModelServer) -> dict:
    """Start the workers and the sweeper, run the workload, return the figures (see the module doc)."""
    import redis
    from django.contrib.auth import get_user_model

    from django.utils import timezone

    from runs.models import TERMINAL_STATUSES, Agent, Run

    env = dict(os.environ)
    if args.runs_in_flight is not None:
        env[RUNS_IN_FLIGHT_VARIABLE] = str(args.runs_in_flight)
    log_dir = services.log_dir
    cluster = Cluster(env, args.workers, args.threads, log_dir)
    try:
        broker = redis.Redis.from_url(env["REDIS_URL"])
        heartbeats = f"{env['DRAMATIQ_NAMESPACE']}:__heartbeats__"
        broker.delete(heartbeats)  # the bench's own namespace: count only the workers started here
        workers = [cluster.start_worker(i) for i in range(args.workers)]
        sweeper = cluster.start_sweeper({**env, "LOG_LEVEL": "INFO"})
        wait_for(lambda: broker.zcard(heartbeats) >= args.workers, 60, "workers")

        agent = Agent.objects.create(
            slug=f"bench-latency-{uuid.uuid4().hex[:8]}", name="bench latency",
            instructions="Look the order up, refund what the requester asks, then say what you did.",
            tools=["query_order", "refund"], completion_check="refund",
            model={"provider": "openai", "endpoint": ENDPOINT, "model": MODEL_NAME, "stream": args.stream})
        orders = create_orders(args.runs + args.warmup_runs)
        orders, warmup = orders[:args.runs], orders[args.runs:]
        requester = get_user_model().objects.get(username="requester")
        warmup_ids = start_all(agent, requester, [f"refund order {n}" for n in warmup], one_by_one=True)
        wait_for(lambda: not Run.objects.filter(pk__in=warmup_ids).exclude(status__in=TERMINAL_STATUSES).exists(),
                 120, "the warm-up runs")
        warmup_ended = Counter(Run.objects.filter(pk__in=warmup_ids).values_list("outcome", flat=True))

        sampler = RssSampler({f"worker-{i}": w.pid for i, w in enumerate(workers)}, args.sample_s,
                             held=lambda: Run.objects.filter(lease_expires_at__gt=timezone.now()).count())
        pg_pid = postgres_pid()
        meter = CpuMeter({"worker": [w.pid for w in workers], "sweeper": [sweeper.pid],
                          "gateway": [services.others[0].pid], "model server": [model.process.pid],
                          "postgresql": [pg_pid] if pg_pid else []}, env["REDIS_URL"])
        model.reset()
        xacts_before = database.transactions()
        sampler.start()
        started = time.time()
        run_ids = start_all(agent, requester, [f"refund order {number}" for number in orders], args.one_by_one)
        created = time.time()
        wait_until_ended(run_ids, time.monotonic() + args.timeout, 0.2, settled=waiting_for_a_person)
        ended = time.time()
        left_to_people = waiting_for_a_person(run_ids)
        sampler.stop()
        meter.stop()
        model_stats = model.stats()
        xacts = database.transactions() - xacts_before
        sweeper_log = (log_dir / "sweeper.log").read_text()
    finally:
        cluster.stop()
    base = tollgate_figures(run_ids, {}, started, created, ended)
    durations = [(r.finished_at - r.created_at).total_seconds()
                 for r in Run.objects.filter(pk__in=run_ids, finished_at__isnull=False)]
    steps = base["steps"]
    figures = {key: base[key] for key in ("runs", "runs_ended", "runs_not_ended", "steps", "model_calls",
                                          "tool_executions", "seconds_creating")}
    figures["run duration ms (created -> finished)"] = p50_p99(durations)
    if left_to_people:
        figures["runs left waiting for a person (not counted in the wall time), by reason"] = left_to_people
    figures["wall seconds (first run created -> last run finished)"] = base["seconds"]
    figures["steps_per_s"] = base["steps_per_s"]
    figures["latency_ms"] = {key: base["latency_ms"][key]
                             for key in ("run created -> first model call", "tool result -> next model call")}
    figures.update(side_figures(model_stats, sampler, meter.ms_per_step(steps), xacts, steps))
    figures["warm-up runs (before the measured ones), by outcome"] = dict(warmup_ended)
    figures["sweeper_reenqueued"] = sum(int(n) for n in re.findall(r"reenqueued=(\d+)", sweeper_log))
    figures["logs"] = str(log_dir)
    return figures


def start_all(agent, user, inputs: list[str], one_by_one: bool) -> list[int]:
    """Start a run per input (``start_runs``, ``TOLLGATE["RUN_BATCH_MAX"]`` at a time, or ``start_run`` for each);
    their ids, in order."""
    from django.conf import settings

    from runs.engine.lifecycle import start_run, start_runs

    if one_by_one:
        return [start_run(agent=agent, user=user, input=text).pk for text in inputs]
    size = settings.TOLLGATE["RUN_BATCH_MAX"]
    return [run.pk for first in range(0, len(inputs), size)
            for run in start_runs(agent=agent, user=user, inputs=inputs[first:first + size])]


def waiting_for_a_person(run_ids: list[int]) -> dict[str, list[int]] | None:
    """``{waiting reason: run ids}`` when every run of ``run_ids`` that has not ended waits for a person
    (an approval, an input, or a call whose outcome stayed unknown: reconciliation), else None.

    Such a run is where the design sends it (e.g. a refund that timed out at the gateway and was not found
    by its lookup), not stuck: the harness stops waiting for it and names it, rather than running into
    ``--timeout`` and printing nothing.
    """
    from runs.models import TERMINAL_STATUSES, Run, RunStatus, WaitingReason

    people = {WaitingReason.APPROVAL, WaitingReason.INPUT, WaitingReason.RECONCILIATION}
    left = Run.objects.filter(pk__in=run_ids).exclude(status__in=TERMINAL_STATUSES).values_list(
        "pk", "status", "waiting_reason")
    by_reason: dict[str, list[int]] = {}
    for pk, status, reason in left:
        if status != RunStatus.WAITING or reason not in people:
            return None
        by_reason.setdefault(reason, []).append(pk)
    return by_reason or None


# --- LangGraph ---------------------------------------------------------------

LG_TOOLS = [
    {"type": "function", "function": {
        "name": "query_order", "description": "Look up an order: total, status, amount still refundable.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "refund", "description": "Refund an amount on an order through the payment gateway.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}, "amount": {"type": "number"}},
                       "required": ["order_id", "amount"]}}},
]


def langgraph_worker(index: int, processes: int, orders: list[int], settings: dict, go, done, results) -> None:
    """One LangGraph process: build the graph, make one warm-up run, wait for ``go``, then start every
    ``processes``-th run of ``orders`` from ``index`` at once; exit once ``done`` is set.

    ``settings``: ``database_url``, ``gateway_url``, ``model_url`` (the
    model server's ``/v1``), ``stream``, ``pool`` (connections),
    ``warmup_orders`` (one per process, not in ``orders``). Puts
    ``{"ready": index}`` on ``results`` after the warm-up run, then
    ``{"runs", "achieved", "failed", "errors", "model_calls",
    "tool_executions", "refunds", "started", "ended", "durations"}``
    (epoch seconds; ``durations`` in seconds, one per run that ended;
    ``errors`` the first few failures' texts); any exception as
    ``{"error": text}``.
    """
    try:
        asyncio.run(_langgraph_process(index, processes, orders, settings, go, results))
    except Exception as exc:  # reported by the parent
        import traceback

        results.put({"error": f"{exc!r}\n{traceback.format_exc()}"})
    done.wait(timeout=60)


async def _langgraph_process(index, processes, orders, settings, go, results):
    import aiohttp
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, convert_to_openai_messages
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.graph import MessagesState
    from openai import AsyncOpenAI, AsyncStream, DefaultAioHttpClient
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    counts = {"model_calls": 0, "tool_executions": 0, "refunds": 0}
    transport = {"http_client": DefaultAioHttpClient()} if settings["client"] == "post" else {}
    client = AsyncOpenAI(base_url=settings["model_url"], api_key="unused", max_retries=0, timeout=600, **transport)
    gateway = aiohttp.ClientSession(base_url=settings["gateway_url"], timeout=aiohttp.ClientTimeout(total=30))
    pool = AsyncConnectionPool(settings["database_url"], min_size=settings["pool"], max_size=settings["pool"],
                               timeout=600, open=False,
                               kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row})
    await pool.open(wait=True)

    async def order_row(order_id: int) -> dict | None:
        async with pool.connection() as conn:
            cursor = await conn.execute("SELECT total, status, shipped FROM demo_order WHERE number = %s", [order_id])
            return await cursor.fetchone()

    async def refunded(order_id: int) -> Decimal:
        async with gateway.get("/refunds", params={"order_id": order_id}) as response:
            response.raise_for_status()
            return Decimal((await response.json())["total"])

    async def query_order(args: dict) -> dict:
        row = await order_row(args["order_id"])
        if row is None:
            return {"error": "no such order"}
        done = await refunded(args["order_id"])
        return {"order_id": args["order_id"], "total": str(row["total"]), "status": row["status"],
                "shipped": row["shipped"], "refunded": str(done), "refundable_amount": str(row["total"] - done)}

    async def refund(args: dict, key: str) -> dict:
        row = await order_row(args["order_id"])
        if row is None or Decimal(str(args["amount"])) > row["total"] - await refunded(args["order_id"]):
            return {"error": "not refundable"}
        async with gateway.post("/refunds", headers={"Idempotency-Key": key},
                                json={"order_id": args["order_id"], "amount": f"{args['amount']:.2f}"}) as response:
            response.raise_for_status()
            counts["refunds"] += 1
            return await response.json()

    async def posted(params: dict) -> tuple[str, list[dict]]:
        """``--langgraph-client post``: the request as Tollgate's provider sends it (``client.post``, plain JSON)."""
        if not settings["stream"]:
            message = (await client.post("/chat/completions", body=params, cast_to=object))["choices"][0]["message"]
            return message.get("content") or "", [
                {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in message.get("tool_calls") or ()]
        text, calls = [], {}
        stream = await client.post("/chat/completions", body={**params, "stream": True}, cast_to=object, stream=True,
                                   stream_cls=AsyncStream[object])
        async with stream:
            async for chunk in stream:
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    text.append(delta.get("content") or "")
                    for part in delta.get("tool_calls") or ():
                        call = calls.setdefault(part.get("index", 0), {"id": "", "name": "", "arguments": ""})
                        function = part.get("function") or {}
                        call["id"] = part.get("id") or call["id"]
                        call["name"] = call["name"] or function.get("name") or ""
                        call["arguments"] += function.get("arguments") or ""
        return "".join(text), [calls[i] for i in sorted(calls)]

    async def model(state: MessagesState) -> dict:
        params = {"model": MODEL_NAME, "messages": convert_to_openai_messages(state["messages"]), "tools": LG_TOOLS}
        if settings["client"] == "post":
            content, raw_calls = await posted(params)
        elif settings["stream"]:
            text, calls = [], {}
            async for chunk in await client.chat.completions.create(**params, stream=True):
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    for part in choice.delta.tool_calls or []:
                        call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                        call["id"] = part.id or call["id"]
                        call["name"] = call["name"] or (part.function and part.function.name) or ""
                        call["arguments"] += (part.function and part.function.arguments) or ""
            content, raw_calls = "".join(text), [calls[i] for i in sorted(calls)]
        else:
            message = (await client.chat.completions.create(**params)).choices[0].message
            content = message.content or ""
            raw_calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                         for c in message.tool_calls or []]
        counts["model_calls"] += 1
        return {"messages": [AIMessage(content=content, tool_calls=[
            {"name": c["name"], "args": json.loads(c["arguments"] or "{}"), "id": c["id"]} for c in raw_calls])]}

    async def tools(state: MessagesState, config) -> dict:
        out = []
        for call in state["messages"][-1].tool_calls:
            if call["name"] == "refund":
                result = await refund(call["args"], f"lg-{config['configurable']['thread_id']}-{call['id']}")
            else:
                result = await query_order(call["args"])
            counts["tool_executions"] += 1  # only reached once the tool did its work
            out.append(ToolMessage(content=json.dumps(result), tool_call_id=call["id"], name=call["name"]))
        return {"messages": out}

    graph = model_tools_graph(model, tools).compile(checkpointer=AsyncPostgresSaver(pool))
    mine = orders[index::processes]
    durations: list[float] = []

    async def one(order_id: int) -> bool:
        """One run; True when achieved (the refund went through and the last message is the final text)."""
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        state = await graph.ainvoke({"messages": [HumanMessage(f"refund order {order_id}")]}, config,
                                    durability="sync")
        durations.append(time.time() - t0)
        refunds = [json.loads(m.content) for m in state["messages"]
                   if isinstance(m, ToolMessage) and m.name == "refund"]
        last = state["messages"][-1]
        return bool(refunds) and "error" not in refunds[-1] and isinstance(last, AIMessage) and not last.tool_calls

    t0 = time.time()
    if not await one(settings["warmup_orders"][index]):
        raise RuntimeError("the warm-up run was not achieved")
    counts.update(model_calls=0, tool_executions=0, refunds=0)
    durations.clear()
    results.put({"ready": index})
    await asyncio.to_thread(go.wait)
    t0 = time.time()
    outcomes = await asyncio.gather(*(one(order_id) for order_id in mine), return_exceptions=True)
    ended = time.time()
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    results.put({"runs": len(mine), "achieved": sum(o is True for o in outcomes), "failed": len(mine) - sum(
        o is True for o in outcomes), "errors": errors[:3], **counts, "started": t0, "ended": ended,
        "durations": durations})
    await gateway.close()
    await client.close()
    await pool.close()


def run_langgraph(args, processes: int, database: Database, services: Cluster, model: ModelServer) -> dict:
    """The LangGraph side with ``processes`` processes; returns its figures."""
    from langgraph.checkpoint.postgres import PostgresSaver

    database_url = os.environ["DATABASE_URL"]
    with PostgresSaver.from_conn_string(database_url) as saver:
        saver.setup()  # the checkpoint tables, once
    orders = create_orders(args.runs + processes)
    orders, warmup = orders[:args.runs], orders[args.runs:]
    settings = {"database_url": database_url, "gateway_url": os.environ["GATEWAY_URL"],
                "model_url": f"{model.url}/v1", "stream": args.stream, "client": args.langgraph_client,
                "pool": args.langgraph_pool,
                "warmup_orders": warmup}
    ctx = multiprocessing.get_context("spawn")
    go, done, results = ctx.Event(), ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=langgraph_worker, args=(i, processes, orders, settings, go, done, results),
                            daemon=True)
                for i in range(processes)]
    for child in children:
        child.start()
    for _ in children:  # imports, pools, graph compilation and the warm-up run stay outside the measured window
        ready = results.get(timeout=120)
        if "error" in ready:
            raise RuntimeError(f"LangGraph process failed:\n{ready['error']}")
    sampler = RssSampler({f"langgraph-{i}": child.pid for i, child in enumerate(children)}, args.sample_s)
    pg_pid = postgres_pid()
    meter = CpuMeter({"langgraph processes": [child.pid for child in children],
                      "gateway": [services.others[0].pid], "model server": [model.process.pid],
                      "postgresql": [pg_pid] if pg_pid else []}, None)
    model.reset()
    xacts_before = database.transactions()
    sampler.start()
    go.set()
    reports = []
    try:
        reports = [results.get(timeout=args.timeout) for _ in children]
    finally:
        sampler.stop()
        meter.stop()  # each child waits for "done" before it exits: its CPU times go with it
        done.set()
    model_stats = model.stats()
    xacts = database.transactions() - xacts_before
    for child in children:
        child.join(timeout=30)
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        raise RuntimeError("LangGraph process failed:\n" + "\n".join(errors))
    steps = sum(r["model_calls"] + r["tool_executions"] for r in reports)
    window = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    failures = [e for r in reports for e in r["errors"]]
    figures = {
        "processes": processes,
        "runs": sum(r["runs"] for r in reports),
        "runs achieved": sum(r["achieved"] for r in reports),
        "runs failed": sum(r["failed"] for r in reports),
        **({"first failures": failures[:3]} if failures else {}),
        "steps": steps,
        "model_calls": sum(r["model_calls"] for r in reports),
        "tool_executions": sum(r["tool_executions"] for r in reports),
        "refunds_made": sum(r["refunds"] for r in reports),
        "run duration ms (start -> end)": p50_p99([d for r in reports for d in r["durations"]]),
        "wall seconds (start -> last run ended)": round(window, 2),
        "steps_per_s": round(steps / window, 1),
    }
    figures.update(side_figures(model_stats, sampler, meter.ms_per_step(steps), xacts, steps))
    return figures


# --- main ----------------------------------------------------------------------

def main() -> int:
    args = parse_args()
    if args.warmup_runs is None:
        args.warmup_runs = args.workers * args.threads
    if not require_postgres_and_redis("latency"):
        return 2
    gateway_port, model_port = free_port(), free_port()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    endpoints = {ENDPOINT: {"provider": "openai", "base_url": f"http://127.0.0.1:{model_port}/v1"}}
    prepare_django("latency", {"GATEWAY_URL": f"http://127.0.0.1:{gateway_port}",
                               "TOLLGATE_MODEL_ENDPOINTS": json.dumps(endpoints)})
    database = Database()

    print(f"latency: {args.runs} runs of {STEPS_PER_RUN} steps (3 model calls + 2 tool calls), started at once; "
          f"model latency {args.latency} s, {'streamed' if args.stream else 'not streamed'}; "
          f"{os.cpu_count()} CPUs", flush=True)
    services = Cluster(dict(os.environ), 0, 1, Path(tempfile.mkdtemp(prefix="tollgate-latency-")))
    tollgate, langgraph = None, {}
    try:
        services.start_gateway(gateway_port)
        wait_for(lambda: healthy(f"{os.environ['GATEWAY_URL']}/health"), 15, "gateway")
        model = ModelServer(services, model_port, args)
        if not args.skip_tollgate:
            tollgate = without_collector_pauses(lambda: run_tollgate(args, database, services, model))
            in_flight = f", {args.runs_in_flight} runs in flight each" if args.runs_in_flight is not None else ""
            print_figures(f"Tollgate, {args.workers} worker process(es) x {args.threads} thread(s){in_flight}:",
                          tollgate)
            sys.stdout.flush()
        for processes in args.langgraph_processes:
            langgraph[processes] = run_langgraph(args, processes, database, services, model)
            print_figures(f"LangGraph (async) + AsyncPostgresSaver (durability=sync), {processes} process(es), "
                          f"model client {args.langgraph_client}:",
                          langgraph[processes])
            sys.stdout.flush()
    finally:
        services.stop()
    tollgate_wall = tollgate["wall seconds (first run created -> last run finished)"] if tollgate else None
    for processes, other in langgraph.items() if tollgate else ():
        lg_wall = other["wall seconds (start -> last run ended)"]
        print(f"Tollgate ({args.workers} worker processes) / LangGraph ({processes} process(es)): wall time "
              f"{tollgate_wall} s / {lg_wall} s = {tollgate_wall / lg_wall:.2f}")
    failed = (tollgate["runs_not_ended"] + sum(n for key, n in tollgate["runs_ended"].items()
                                               if key != "completed/achieved") if tollgate else 0)
    failed += sum(other["runs failed"] for other in langgraph.values())
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
