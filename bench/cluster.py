"""Processes the benchmarks start against PostgreSQL + Redis (shared by chaos.py and throughput.py),
and the Django set-up every benchmark process shares (``prepare_django``).

``Cluster`` starts the demo payment gateway, ``manage.py rundramatiq``
worker groups, the sweeper and an API server (Daphne), each in its own
session (process group) with its output in ``log_dir``, and SIGKILLs them
all on ``stop()``.
"""

import gc
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def without_collector_pauses(measurement):
    """Run ``measurement()`` with this process's cyclic garbage collector off (its objects so far frozen).

    A bench's clients and driver live in one process that holds Django and
    the bench's bookkeeping: a full collection there took 120-170 ms
    (``bench/live.py``'s 100 clients) and delayed whatever the process was
    timing, so its own pause showed as the server's latency. Reference
    counting still frees what the measurement drops; the collector is back
    on afterwards. Returns what ``measurement`` returns.
    """
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return measurement()
    finally:
        gc.enable()
        gc.unfreeze()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(url: str) -> bool:
    """Whether ``url`` answers 200 within half a second."""
    import httpx

    try:
        return httpx.get(url, timeout=0.5).status_code == 200
    except httpx.TransportError:
        return False


def wait_for(predicate, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s until it is true; RuntimeError after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up")
        time.sleep(0.1)


def require_postgres_and_redis(name: str) -> bool:
    """True if ``DATABASE_URL`` names PostgreSQL and ``REDIS_URL`` is set; else say so on stderr."""
    if os.environ.get("DATABASE_URL", "").startswith("postgres") and os.environ.get("REDIS_URL"):
        return True
    print(f"{name}: set DATABASE_URL (PostgreSQL) and REDIS_URL", file=sys.stderr)
    return False


def prepare_django(name: str, extra_env: dict | None = None, *, demo: bool = True) -> None:
    """Set the environment of a benchmark named ``name``, set Django up, migrate and (``demo``) load the demo.

    The broker and channel-layer namespaces default to ``tollgate-<name>-bench``
    (kept when the caller set them), the API rates are lifted (one user
    drives the benchmark; its rate would otherwise be what is measured),
    ``extra_env`` is added on top, and a ``SECRET_KEY`` of this invocation
    is made unless one is given or ``DEBUG`` is on. Child processes started
    afterwards inherit all of it.
    """
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DRAMATIQ_NAMESPACE": os.environ.get("DRAMATIQ_NAMESPACE", f"tollgate-{name}-bench"),
        "CHANNELS_PREFIX": os.environ.get("CHANNELS_PREFIX", f"tollgate-{name}-bench"),
        "THROTTLE_USER": "1000000/min",
        "THROTTLE_RUNS": "1000000/min",
        **(extra_env or {}),
    })
    if not os.environ.get("SECRET_KEY") and os.environ.get("DEBUG", "").lower() not in ("1", "true", "yes", "on"):
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if demo:
        call_command("demo", force=True, stdout=open(os.devnull, "w"))


class Cluster:
    """The processes under test: gateway, worker groups, sweeper, API server."""

    def __init__(self, env: dict, workers: int, threads: int, log_dir: Path, queues: list[str] | None = None):
        """``queues``: the Dramatiq queue each worker group consumes (``--queues``), by index; None: every
        queue its processes declare."""
        self.env = env
        self.threads = threads
        self.queues = queues
        self.log_dir = log_dir
        self.workers: list[subprocess.Popen | None] = [None] * workers
        self.others: list[subprocess.Popen] = []
        self.api: subprocess.Popen | None = None

    def spawn(self, args: list[str], name: str, env: dict | None = None) -> subprocess.Popen:
        """Start ``python args...`` in ROOT in a new session, output appended to ``log_dir/name.log``."""
        log = open(self.log_dir / f"{name}.log", "ab")
        return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env or self.env, stdout=log, stderr=log,
                                start_new_session=True)

    def start_gateway(self, port: int) -> None:
        self.others.append(self.spawn(["-m", "tools.demo.gateway_server", "--port", str(port),
                                       "--ledger", str(self.log_dir / "ledger.sqlite3")], "gateway"))

    def start_sweeper(self, env: dict | None = None) -> subprocess.Popen:
        process = self.spawn(["manage.py", "recover_runs", "--loop"], "sweeper", env)
        self.others.append(process)
        return process

    def start_worker(self, index: int, env: dict | None = None) -> subprocess.Popen:
        queues = ["--queues", self.queues[index]] if self.queues else []
        self.workers[index] = self.spawn(["manage.py", "rundramatiq", "--processes", "1", "--threads",
                                          str(self.threads), "--skip-logging", *queues], f"worker-{index}", env)
        return self.workers[index]

    def start_api(self, port: int, env: dict | None = None) -> subprocess.Popen:
        """Daphne serving ``config.asgi:application`` on 127.0.0.1:``port`` (as in production)."""
        self.api = self.spawn(["-m", "config.http_server", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
                              "api", env)
        self.others.append(self.api)
        return self.api

    def kill_worker(self, index: int) -> None:
        """SIGKILL the whole process group of worker ``index`` (as a machine crash would)."""
        process = self.workers[index]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def revive(self) -> int:
        """Restart worker groups that died by themselves (a failpoint killed their process); returns how many."""
        dead = [i for i, process in enumerate(self.workers) if process is not None and process.poll() is not None]
        for index in dead:
            self.kill_worker(index)  # the rest of the group, if anything is left
            self.start_worker(index)
        return len(dead)

    def stop(self) -> None:
        for process in [p for p in self.workers if p] + self.others:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
