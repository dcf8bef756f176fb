"""Live-update latency: a run's transition -> the WebSocket clients that watch it.

Needs ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL`` like bench/chaos.py
(``bash bench/run.sh --bench live ...`` starts private ones). The harness
migrates the database, loads the demo, makes ``--runs`` runs that wait for
an approval (rows written directly: no model is involved) and starts one
API server (Daphne with the Redis channel layer, as in production). It then
opens ``--clients`` WebSocket connections, logged in as a staff user:

* ``list`` mode (default): every client watches ``ws/runs/`` -- what an
  open inbox or run list tab does -- so each transition reaches every
  client;
* ``run`` mode: client *i* watches ``ws/runs/<run i mod runs>/`` -- what an
  open run page does.

The driver cancels the runs one after another through the REST API
(``POST /api/runs/<id>/cancel/``, token auth, real HTTP), one every
``--interval-ms`` milliseconds; a waiting run is cancelled in the request,
so each POST is one transition committed by the API process. For every
``run.update`` with status ``cancelled`` a client receives, it records two
latencies (same host clock):

* transition -> client: from the run's ``updated_at`` (stamped when the
  transition was applied, before its commit) to the message's arrival;
* POST -> client: from the moment the driver sent the POST.

It prints p50/p95/p99/max of both over every delivery, how many deliveries
were expected and how many arrived, and the API server's CPU time.
Not a test: nothing here asserts a speed.

Example: ``python bench/live.py --clients 100 --runs 200 --interval-ms 20``
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import (  # noqa: E402
    Cluster, free_port, healthy, prepare_django, require_postgres_and_redis, wait_for, without_collector_pauses)
from bench.throughput import percentile, tree_cpu_s  # noqa: E402

BENCH_USER = "live-bench"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100, help="WebSocket clients (default 100)")
    parser.add_argument("--runs", type=int, default=200, help="waiting runs to cancel, one transition each")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="time between two cancels (default 20)")
    parser.add_argument("--mode", choices=("list", "run"), default="list",
                        help="clients watch the run list (every run) or one run page each")
    return parser.parse_args()


def prepare(runs: int) -> tuple[list[int], str, str]:
    """Waiting runs, and the staff user's session key and API token."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore
    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    from runs.models import Agent, Run, RunStatus, Session, WaitingReason

    user, _ = get_user_model().objects.get_or_create(username=BENCH_USER, defaults={"is_staff": True})
    token, _ = Token.objects.get_or_create(user=user)
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "runs.permissions.PermissionsBackend"  # as config.settings lists it
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    agent = Agent.objects.order_by("pk").first()
    now = timezone.now()
    sessions = Session.objects.bulk_create([Session(owner=user, agent=agent) for _ in range(runs)])
    created = Run.objects.bulk_create([
        Run(session=session, agent=agent, requested_by=user, input="live bench", status=RunStatus.WAITING,
            waiting_reason=WaitingReason.APPROVAL, started_at=now)
        for session in sessions
    ])
    return [run.pk for run in created], store.session_key, token.key


async def client(url: str, origin: str, cookie: str, sent: dict, latencies: dict, connected: asyncio.Semaphore,
                 stop: asyncio.Event) -> None:
    """One WebSocket client: records the latency of every ``cancelled`` update it receives."""
    from websockets.asyncio.client import connect

    async with connect(url, origin=origin, additional_headers={"Cookie": cookie}, open_timeout=30,
                       max_size=2**20) as socket:
        connected.release()
        while not stop.is_set():
            try:
                raw = await asyncio.wait_for(socket.recv(), timeout=0.5)
            except TimeoutError:
                continue
            arrived = time.time()
            message = json.loads(raw)
            run = message.get("run") or {}
            if message.get("type") != "run.update" or run.get("status") != "cancelled":
                continue
            stamped = datetime.fromisoformat(run["updated_at"]).timestamp()
            latencies["transition"].append(arrived - stamped)
            if run["id"] in sent:
                latencies["post"].append(arrived - sent[run["id"]])


async def measure(args, port: int, run_ids: list[int], session_key: str, token: str) -> dict:
    import httpx

    origin = f"http://127.0.0.1:{port}"
    cookie = f"sessionid={session_key}"
    sent: dict[int, float] = {}
    latencies = {"transition": [], "post": []}
    stop = asyncio.Event()
    connected = asyncio.Semaphore(0)
    urls = [f"ws://127.0.0.1:{port}/ws/runs/" if args.mode == "list"
            else f"ws://127.0.0.1:{port}/ws/runs/{run_ids[i % len(run_ids)]}/" for i in range(args.clients)]
    tasks = [asyncio.create_task(client(url, origin, cookie, sent, latencies, connected, stop)) for url in urls]
    for _ in urls:
        await asyncio.wait_for(connected.acquire(), timeout=60)
    await asyncio.sleep(0.5)
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(base_url=origin, headers={"Authorization": f"Token {token}"}, timeout=30) as http:
        for run_id in run_ids:
            sent[run_id] = time.time()
            response = await http.post(f"/api/runs/{run_id}/cancel/")
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            await asyncio.sleep(args.interval_ms / 1000)
    # list mode: every client sees every cancel; run mode: each client sees its own run's one cancel
    expected = len(run_ids) * args.clients if args.mode == "list" else args.clients
    deadline = time.monotonic() + 10
    while len(latencies["transition"]) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"latencies": latencies, "expected": expected, "cancel_statuses": statuses}


def figures(values: list[float]) -> str:
    if not values:
        return "none"
    ms = [v * 1000 for v in values]
    return (f"p50 {percentile(ms, 50):.1f} ms, p95 {percentile(ms, 95):.1f} ms, p99 {percentile(ms, 99):.1f} ms, "
            f"max {max(ms):.1f} ms")


def main() -> int:
    args = parse_args()
    if not require_postgres_and_redis("live"):
        return 2
    prepare_django("live", {"ALLOWED_HOSTS": "127.0.0.1,localhost"})
    run_ids, session_key, token = prepare(args.runs)
    port = free_port()
    cluster = Cluster(dict(os.environ), 0, 1, Path(tempfile.mkdtemp(prefix="tollgate-live-")))
    try:
        api = cluster.start_api(port)
        wait_for(lambda: healthy(f"http://127.0.0.1:{port}/accounts/login/"), 30, "API server")
        cpu_before = tree_cpu_s(api.pid)
        result = without_collector_pauses(lambda: asyncio.run(measure(args, port, run_ids, session_key, token)))
        cpu = tree_cpu_s(api.pid) - cpu_before
    finally:
        cluster.stop()
    lat = result["latencies"]
    print(f"live: {args.clients} WebSocket clients ({args.mode} mode), {len(run_ids)} transitions "
          f"(one cancel every {args.interval_ms:g} ms), {os.cpu_count()} CPUs")
    print(f"  cancel POSTs by status: {result['cancel_statuses']}")
    print(f"  deliveries: {len(lat['transition'])} of {result['expected']} expected")
    print(f"  transition -> client: {figures(lat['transition'])}")
    print(f"  POST sent -> client: {figures(lat['post'])}")
    print(f"  API server CPU: {cpu:.2f} s ({cpu * 1000 / max(1, len(run_ids)):.1f} ms per transition)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
