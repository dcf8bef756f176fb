"""Shared fixtures: users, a real Dramatiq worker, API clients.

Tests run against whatever ``DATABASE_URL`` / ``REDIS_URL`` say: PostgreSQL
and Redis in CI's production-shape pass, SQLite and the stub broker in the
embedded pass. The worker is a real ``dramatiq.Worker`` consuming the
configured broker in this process. Plain helpers live in ``tests.support``.

Everything here runs on the tests' own tools (``tests.support.fake_tools``;
calls, agents and waiting runs of them in ``tests.support.core``) and users
(``people``). The demo app (``tools.demo``: its data, tools and payment
gateway) is known only under ``tests/demo/``, whose fixtures are its own
(``tests/demo/conftest.py``); its tests are marked ``demo`` and skipped
under settings without the demo app (``tests.settings_nodemo``).
"""

import subprocess
import sys
import time

import dramatiq
import pytest
from django.apps import apps
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from runs.base import awaiting
from runs.engine import runtime
from runs.engine.group_commit import GroupCommit
from tests.support.fake_tools import forget_transfers
from tests.support.processes import worker_environment
from tests.support.webhook_receiver import Receiver
from tests.support.webhooks import FAST_SCHEDULE_S
from tests.support.worker import RunWorker, forget_taken_messages


def pytest_configure(config):
    from django.conf import settings

    # Demo users are created in many tests; PBKDF2 would dominate the runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    config.addinivalue_line("markers", "demo: a test of the demo app (tools.demo, tests/demo/), set by tests/conftest.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the tests of the demo app (``tests/demo/``); skip them when it is not installed."""
    demo_installed = apps.is_installed("tools.demo")
    skip = pytest.mark.skip(reason="needs the demo app (tools.demo), not installed by these settings")
    for item in items:
        if "/tests/demo/" in str(item.path):
            item.add_marker(pytest.mark.demo)
            if not demo_installed:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's test database, and at the end the engine's and the handler pool's threads close
    their connections, so that it can be dropped (PostgreSQL refuses while a connection is open)."""
    yield
    engine = runtime.running_engine()
    if engine is not None:
        engine.wait_idle(60)
        engine.close_connections()
    awaiting.close_connections()


@pytest.fixture(autouse=True)
def engines_let_go(monkeypatch):
    """Engines and group commits a test makes let go of their database connections once it ends.

    A group commit's database threads keep their connection from one job to the
    next (``runs.base.awaiting.holding_connection``), and neither an engine nor a
    group commit is ever stopped (a worker process has one for its life). A test's
    would keep its connections, taken from the process's pool, after the test: so
    once the test's own fixtures are torn down (a hung call set free) its engines'
    runs may finish, and every database thread closes its connection. Autouse, so
    set up before the test's own fixtures and torn down after them; the database
    fixture (``_django_db_helper``, below) depends on it, so it is torn down after
    that fixture emptied or rolled back the tables. Yields ``(engines, group
    commits)`` made by the test, in the order made.
    """
    engines, commits = [], []
    for cls, made in ((runtime.Engine, engines), (GroupCommit, commits)):
        monkeypatch.setattr(cls, "__init__", _noting(cls.__init__, made))
    yield engines, commits
    engines_at_rest(engines, commits, timeout_s=10)
    for group_commit in commits:
        group_commit.close_connections()


@pytest.fixture
def _django_db_helper(engines_let_go, _django_db_helper):
    """pytest-django's database fixture (what ``db``, ``transactional_db`` and the ``django_db`` mark all set up),
    whose teardown empties every table (``TRUNCATE``) or rolls the test's transaction back, once every engine and
    group commit is at rest (``engines_at_rest``); the test fails (at teardown) if one is still at work after
    30 s.

    An engine's threads go on after the test's last line: a run handed over may still wait for the process
    to empty (a suspect in ``Engine.submit``, not in flight yet), a slice freed as the test ends still
    writes its last step and ends on a database thread. A ``TRUNCATE`` beside them waits for the locks
    their transactions hold while they wait for its: a deadlock. The fixtures that free a test's calls
    (``hung``) depend on ``transactional_db``, so they are torn down before this one.
    """
    yield
    busy = engines_at_rest(*engines_let_go, timeout_s=30)
    assert not busy, f"still at work 30 s after the test, before its tables are emptied: {busy}"


_stuck: list = []  # engines once found still at work after a test: not waited for again (one stuck slice would
# otherwise cost every later test its 30 s)


def engines_at_rest(engines, commits, *, timeout_s: float) -> list:
    """Wait until each of ``engines``, the process's (``runtime.running_engine``) and the group commits
    ``commits`` is at rest (``Engine.wait_idle``, ``GroupCommit.wait_idle``: none of their threads touches the
    database then), at most ``timeout_s`` seconds in all; returns those still at work (each reported once)."""
    deadline = time.monotonic() + timeout_s
    process_engine = runtime.running_engine()
    if process_engine is not None and all(engine is not process_engine for engine in engines):
        engines = [*engines, process_engine]
    busy = [made for made in (*engines, *commits) if all(made is not stuck for stuck in _stuck)
            and not made.wait_idle(max(0.0, deadline - time.monotonic()))]
    _stuck.extend(busy)
    return busy


def _noting(init, made: list):
    def noting(instance, *args, **kwargs):
        init(instance, *args, **kwargs)
        made.append(instance)
    return noting


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
    forget_taken_messages(broker)


@pytest.fixture
def worker(idle_worker):
    """A started worker consuming the configured broker in this process."""
    idle_worker.worker.start()
    return idle_worker


@pytest.fixture
def people(transactional_db):
    """Users for tests about the core, without the demo data: ``{username: User}``.

    ``requester`` starts runs, ``approver`` may decide inbox items
    (``approvals.decide_interrupt``, through the group ``approvers``),
    ``admin`` is a superuser; each has the address ``<username>@example.com``.
    """
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    User = get_user_model()
    users = {"requester": User.objects.create_user("requester", email="requester@example.com"),
             "approver": User.objects.create_user("approver", email="approver@example.com"),
             "admin": User.objects.create_superuser("admin", email="admin@example.com")}
    approvers = Group.objects.create(name="approvers")
    approvers.permissions.add(Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals"))
    users["approver"].groups.add(approvers)
    return users


@pytest.fixture(autouse=True)
def no_fake_transfers():
    """Every test starts with the tests' own tools as new: no transfer made, no limit set, no key hidden
    (``tests.support.fake_tools.forget_transfers``)."""
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


@pytest.fixture(autouse=True)
def default_language():
    """Every test starts and ends in the default language: a page requested in Chinese through the test
    client leaves its language active in the thread (``LocaleMiddleware`` activates, nothing deactivates)."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture(autouse=True)
def fresh_throttles(request):
    """Every test with a database starts with empty throttle counters (they live in the default cache)."""
    if {"db", "transactional_db"} & set(request.fixturenames):
        from django.core.cache import cache

        cache.clear()


@pytest.fixture
def short_lease(settings):
    """Leases of one second, so a dead worker's lease expires quickly."""
    settings.TOLLGATE = {**settings.TOLLGATE, "LEASE_TTL_S": 1.0}
    return 1.0


@pytest.fixture
def worker_process(short_lease, settings):
    """``worker_process(run_id, failpoint=None, kill_when=None, env=None, tools=(), first=()) -> exit code``:
    advance a run in a separate process.

    The process runs the real ``advance_run`` actor with this test process's
    settings module, against this test's database and the tests' own tools,
    whose transfers it keeps in the ledger this process reads
    (``tests.support.fake_tools``); ``env`` is added to its environment and
    ``tools`` (names of tools defined but not registered in
    ``tests.support.fake_tools``, e.g. ``fake_notice``) are registered in it.
    The runs ``first`` are handed to it before ``run_id``, which waits (at
    most 30 s) until each of them has a tool call running.
    With a failpoint it SIGKILLs itself there (exit code -9), with
    ``kill_when`` (a predicate) it is SIGKILLed once that holds.
    """

    def run(run_id: int, failpoint: str | None = None, kill_when=None, env: dict | None = None,
            tools: tuple[str, ...] = (), first: tuple[int, ...] = ()) -> int:
        env = worker_environment(TOLLGATE_LEASE_TTL_S=str(short_lease), TOLLGATE_FAILPOINTS=failpoint or "",
                                 **(env or {}))
        code = "\n".join((
            "import time, django; django.setup()",
            "from runs.engine.actors import advance_run; from runs.engine.runtime import engine",
            "from tests.support.fake_tools import register_test_tools; from tools.models import ToolCall",
            f"register_test_tools({list(tools)!r}); first = {list(first)!r}",
            "for other in first: advance_run(other)",
            "deadline = time.monotonic() + 30",
            "while (ToolCall.objects.filter(run_id__in=first, status='running').values('run').distinct().count()",
            "       < len(first) and time.monotonic() < deadline): time.sleep(0.02)",
            f"advance_run({run_id}); engine().wait_idle(60)"))
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
    """A real webhook endpoint on loopback (``tests.support.webhook_receiver.Receiver``)."""
    endpoint = Receiver()
    yield endpoint
    endpoint.close()


@pytest.fixture
def webhook_settings(settings):
    """Settings that let subscriptions point at the loopback receiver, with retries fast enough for a test."""
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "WEBHOOK_ALLOW_HTTP": True,
                         "WEBHOOK_RETRY_SCHEDULE_S": FAST_SCHEDULE_S, "WEBHOOK_TIMEOUT_S": 5.0}
    return settings
