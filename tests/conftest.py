"""Shared fixtures: users (with or without the demo data), a real Dramatiq worker, API clients.

Tests run against whatever ``DATABASE_URL`` / ``REDIS_URL`` say: PostgreSQL
and Redis in CI's production-shape pass, SQLite and the stub broker in the
embedded pass. The worker is a real ``dramatiq.Worker`` consuming the
configured broker in this process.
"""

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import httpx
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from runs.base import awaiting
from runs.engine import runtime
from runs.engine.actors import advance_run
from tests.fake_tools import forget_transfers
from tools.demo import gateway
from tools.demo.data import load_demo
from tests.webhook_helpers import FAST_SCHEDULE_S
from tests.webhook_receiver import Receiver


def pytest_configure(config):
    from django.conf import settings

    # Demo users are created in many tests; PBKDF2 would dominate the runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class RunWorker:
    """A started Dramatiq worker; ``drain()`` waits until every queued message is processed and the
    engine it hands runs to (``runs.engine.runtime``) has none in flight."""

    def __init__(self, broker):
        self.broker = broker
        self.worker = Worker(broker, worker_timeout=20, worker_threads=1)

    def drain(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        engine = runtime.engine()
        while True:  # a slice that ends may send its run to the queue again
            self._join(deadline)
            handed_over = engine.submitted
            if not engine.wait_idle(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{engine.in_flight} runs still in flight after {timeout_s} s")
            self._join(deadline)
            if engine.submitted == handed_over and engine.in_flight == 0:
                return

    def _join(self, deadline: float) -> None:
        self.broker.join(advance_run.queue_name, timeout=max(1, int((deadline - time.monotonic()) * 1000)))
        self.worker.join()


@pytest.fixture(scope="session", autouse=True)
def pool_threads_let_go_of_the_test_database(django_db_setup):
    """At the end, the engine's and the handler pool's threads close their connections, so that the test
    database can be dropped (PostgreSQL refuses while a connection is open)."""
    yield
    engine = runtime.running_engine()
    if engine is not None:
        engine.wait_idle(60)
        engine.close_connections()
    awaiting.close_connections()


@pytest.fixture
def idle_worker(transactional_db):
    """A worker that is not consuming yet: call ``.worker.start()`` when the test is ready."""
    broker = dramatiq.get_broker()
    broker.flush_all()
    run_worker = RunWorker(broker)
    yield run_worker
    run_worker.worker.stop()
    engine = runtime.running_engine()
    if engine is not None:  # runs handed over finish, and the engine's threads let go of the test database
        engine.wait_idle(60)
        engine.close_connections()
        awaiting.close_connections()
    broker.flush_all()
    _forget_taken_messages(broker)


def _forget_taken_messages(broker) -> None:
    """Zero the in-memory queues' count of messages taken but never acknowledged.

    A stopped worker drops what it had prefetched without acknowledging it,
    so Python's ``Queue`` would count those messages as unfinished for good
    and the next test's ``drain()`` would wait on them until it timed out.
    Only the StubBroker (no ``REDIS_URL``) has such queues; Redis keeps its
    own state and is flushed above.
    """
    if not isinstance(broker, StubBroker):
        return
    for queue in broker.queues.values():
        with queue.all_tasks_done:
            queue.unfinished_tasks = 0
            queue.all_tasks_done.notify_all()


@pytest.fixture
def worker(idle_worker):
    """A started worker consuming the configured broker in this process."""
    idle_worker.worker.start()
    return idle_worker


@pytest.fixture
def demo(transactional_db):
    """Load the demo data; return ``{username: User}``."""
    from django.contrib.auth import get_user_model

    load_demo()
    return {u.username: u for u in get_user_model().objects.filter(username__in=["requester", "approver", "admin"])}


@pytest.fixture
def people(transactional_db):
    """Users for tests about the core, without the demo data: ``{username: User}``.

    ``requester`` starts runs, ``approver`` may decide inbox items
    (``approvals.decide_interrupt``), ``admin`` is a superuser.
    """
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    User = get_user_model()
    users = {"requester": User.objects.create_user("requester"),
             "approver": User.objects.create_user("approver"),
             "admin": User.objects.create_superuser("admin")}
    users["approver"].user_permissions.add(
        Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals"))
    return users


@pytest.fixture(autouse=True)
def no_fake_transfers():
    """Every test starts with no transfers made by the ``fake_transfer`` test tool."""
    forget_transfers()


@pytest.fixture
def api():
    """``api(user)`` -> a DRF ``APIClient`` authenticated with the user's token."""

    def client_for(user):
        client = APIClient()
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return client_for


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(env: dict, log_path: Path):
    """Run ``manage.py serve`` on a free loopback port with ``env``, output to ``log_path``.

    Yields the base URL once ``/accounts/login/`` answers (within 30 s,
    else ``RuntimeError`` with the log); stops the server on exit.
    """
    with serving_process(env, log_path) as (base, _):
        yield base


@contextlib.contextmanager
def serving_process(env: dict, log_path: Path):
    """``serving``, yielding ``(base URL, the server's subprocess.Popen)``."""
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}"],
                                   cwd=Path(__file__).resolve().parent.parent, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/accounts/login/", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("manage.py serve did not come up:\n" + log_path.read_text())
                time.sleep(0.2)
        yield base, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class GatewayProcess:
    """The demo payment gateway running as its own process on loopback."""

    def __init__(self, tmp_dir):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ledger_path = str(tmp_dir / "gateway-ledger.sqlite3")
        self.process = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tools.demo.gateway_server", "--port", str(self.port), "--ledger", self.ledger_path],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/health", timeout=0.5)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("payment gateway did not start")

    def ensure_running(self) -> None:
        """Restart the gateway if a test crashed it on purpose."""
        if self.process.poll() is not None:
            self.start()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def faults(self, **faults) -> None:
        """Set fault injection (see ``tools/demo/gateway_server.py``)."""
        httpx.post(f"{self.url}/faults", json=faults, timeout=5).raise_for_status()

    def ledger(self) -> dict:
        return gateway.ledger()


@pytest.fixture(scope="session")
def gateway_process(tmp_path_factory):
    process = GatewayProcess(tmp_path_factory.mktemp("gateway"))
    process.start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def default_language():
    """Every test starts and ends in the default language: a page requested in Chinese through the test
    client leaves its language active in the thread (``LocaleMiddleware`` activates, nothing deactivates)."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Every test starts with empty throttle counters (they live in the default cache)."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def payment_gateway(gateway_process, settings):
    """Every test talks to a fresh ledger of the real gateway process, with no faults."""
    gateway_process.ensure_running()
    settings.GATEWAY_URL = gateway_process.url
    httpx.post(f"{gateway_process.url}/reset", timeout=5).raise_for_status()
    return gateway_process


def database_url_for_subprocess() -> str:
    """A ``DATABASE_URL`` naming the database this test process is using (the test database)."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture
def short_lease(settings):
    """Leases of one second, so a dead worker's lease expires quickly."""
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 1.0}
    return 1.0


@pytest.fixture
def worker_process(payment_gateway, short_lease, settings):
    """``worker_process(run_id, failpoint=None, kill_when=None, env=None) -> exit code``: advance a run in a
    separate process.

    The process runs the real ``advance_run`` actor against this test's
    database and gateway, with ``env`` added to its environment; with a
    failpoint it SIGKILLs itself there (exit code -9), with ``kill_when``
    (a predicate) it is SIGKILLed once that holds.
    """
    import os

    def run(run_id: int, failpoint: str | None = None, kill_when=None, env: dict | None = None) -> int:
        env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(), "GATEWAY_URL": payment_gateway.url,
               "TOLLGATE_LEASE_TTL_S": str(short_lease), "TOLLGATE_FAILPOINTS": failpoint or "",
               "DJANGO_SETTINGS_MODULE": "config.settings", **(env or {})}
        code = ("import django; django.setup(); from runs.engine.actors import advance_run; "
                "from runs.engine.runtime import engine; "
                f"advance_run({run_id}); engine().wait_idle(60)")
        process = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=settings.BASE_DIR)
        if kill_when is not None:
            deadline = time.monotonic() + 30
            while not kill_when() and time.monotonic() < deadline:
                time.sleep(0.02)
            process.kill()
        return process.wait(timeout=60)

    return run


@pytest.fixture
def receiver():
    """A real webhook endpoint on loopback (``tests.webhook_receiver.Receiver``)."""
    endpoint = Receiver()
    yield endpoint
    endpoint.close()


@pytest.fixture
def webhook_settings(settings):
    """Settings that let subscriptions point at the loopback receiver, with retries fast enough for a test."""
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "WEBHOOK_ALLOW_HTTP": True,
                         "WEBHOOK_RETRY_SCHEDULE_S": FAST_SCHEDULE_S, "WEBHOOK_TIMEOUT_S": 5.0}
    return settings
