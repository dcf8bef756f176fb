"""The demo shop is a plug-in app (``tools.demo``, label ``demo``).

* Without it (``tests.settings_nodemo``) the product migrates a new
  database, serves, lists no demo tools and runs an agent of the tests'
  own tools end to end, approval included, through ``manage.py serve``'s
  in-process worker.
* With it, it registers its tools and checks, and ``serve`` starts its
  payment gateway through ``runs.serving``.
* Its ``Order`` moved from the tools app with a pair of migrations: a
  database migrated before the move keeps its orders (rows, ids and
  content type), both ways; a database migrated without the demo app
  keeps them until the app is installed and takes them over.
"""

import io
import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from runs.engine.completion import check_names
from runs.serving import start_services
from tests.support.processes import free_port, serving
from tools.demo.models import Order
from tools.registry import all_tools

ROOT = Path(__file__).resolve().parents[2]
DEMO_TOOLS = {"query_order", "cancel_order", "refund", "legal_check", "send_email"}
LAST_BEFORE_THE_MOVE = ("tools", "0005_policy_lock")
BEFORE_THE_MOVE = [LAST_BEFORE_THE_MOVE, ("demo", None)]

# Run in ``manage.py shell`` of the demo-less product: two people, an agent of the
# test tools, and the people's API tokens (printed as JSON).
SETUP = """
import json
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.authtoken.models import Token
from runs.models import Agent

User = get_user_model()
requester = User.objects.create_user("requester")
approver = User.objects.create_user("approver")
approver.user_permissions.add(Permission.objects.get(codename="decide_interrupt"))
admin = User.objects.create_superuser("admin")
Agent.objects.create(slug="transfer", name="Transfer", tools=["fake_lookup", "fake_transfer"], model={
    "provider": "scripted", "turns": [
        {"tool_calls": [{"name": "fake_lookup", "arguments": {"key": "acme"}}]},
        {"tool_calls": [{"name": "fake_transfer", "arguments": {"account": "acme", "amount": 50}}]},
        {"content": "Sent 50 to acme."}]})
print(json.dumps({user.username: Token.objects.create(user=user).key for user in (requester, approver, admin)}))
"""


def _nodemo_env(tmp_path) -> dict:
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "REDIS_URL", "CACHE_URL", "GATEWAY_URL")}
    return {**env, "DJANGO_SETTINGS_MODULE": "tests.settings_nodemo", "PYTHONUNBUFFERED": "1",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'nodemo.sqlite3'}"}


def _manage(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _wait_for(predicate, what: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def nodemo_server(tmp_path):
    """A new SQLite database migrated by the demo-less product, and ``manage.py serve`` on it.

    Yields ``(base_url, {username: token}, serve_log_path)``.
    """
    env = _nodemo_env(tmp_path)
    migrated = _manage(env, "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    assert "demo" not in migrated.stdout.splitlines()[1], migrated.stdout  # "Apply all migrations: ..."
    tables = _manage(env, "shell", "-c", "from django.db import connection; "
                                         "print(' '.join(connection.introspection.table_names()))")
    assert tables.returncode == 0, tables.stderr
    assert "tools_toolcall" in tables.stdout.split()
    assert not {"tools_order", "demo_order"} & set(tables.stdout.split())
    setup = _manage(env, "shell", "-c", SETUP)
    assert setup.returncode == 0, setup.stderr
    tokens = json.loads(setup.stdout.strip().splitlines()[-1])

    log_path = tmp_path / "serve.log"
    with serving(env, log_path) as base:
        yield base, tokens, log_path


def test_the_product_runs_without_the_demo_app(nodemo_server, tmp_path):
    base, tokens, log_path = nodemo_server

    def client(username):
        return httpx.Client(base_url=base, headers={"Authorization": f"Token {tokens[username]}"}, timeout=10)

    requester, approver, admin = client("requester"), client("approver"), client("admin")
    tools = requester.get("/api/tools/")
    assert tools.status_code == 200
    # the core's built-in waiting tools and the tests' own; none of the shop's
    assert [tool["name"] for tool in tools.json()["results"]] == [
        "ask_user", "fake_lookup", "fake_transfer", "wait_for_delivery", "wait_for_event", "wait_until"]
    refund_agent = admin.post("/api/agents/", json={
        "slug": "refund", "name": "Refund", "tools": ["refund"], "completion_check": "refund",
        "model": {"provider": "scripted", "turns": [{"content": "Done."}]}})
    assert refund_agent.status_code == 400
    assert "Unknown tool 'refund'." in json.dumps(refund_agent.json())
    assert "Unknown completion check 'refund'" in json.dumps(refund_agent.json())

    started = requester.post("/api/runs/", json={"agent": "transfer", "input": "Send 50 to acme."})
    assert started.status_code == 201, started.text
    run_id = started.json()["id"]
    _wait_for(lambda: requester.get(f"/api/runs/{run_id}/").json()["waiting_reason"] == "approval", "the approval")
    items = approver.get("/api/interrupts/", params={"status": "pending", "run": run_id}).json()["results"]
    assert len(items) == 1
    assert approver.post(f"/api/interrupts/{items[0]['id']}/approve/", json={"comment": "ok"}).status_code == 200

    run = _wait_for(lambda: (r := requester.get(f"/api/runs/{run_id}/").json())["status"] == "completed" and r,
                    "the run to complete")
    assert run["outcome"] == "achieved"
    calls = requester.get(f"/api/runs/{run_id}/tool-calls/").json()["results"]
    assert [(call["name"], call["status"]) for call in calls] == [("fake_lookup", "succeeded"),
                                                                  ("fake_transfer", "succeeded")]
    assert calls[1]["result"] == {"transfer_id": 1, "account": "acme", "amount": 50}
    assert "gateway" not in log_path.read_text().lower()
    assert "Unknown command: 'demo'" in _manage(_nodemo_env(tmp_path), "demo").stderr


def test_the_demo_app_registers_its_tools_and_checks():
    assert DEMO_TOOLS <= {tool.name for tool in all_tools()}
    assert {"refund", "cancel_order", "send_email", "default"} <= set(check_names())


def test_serve_starts_the_demo_gateway_only_where_none_answers(settings, payment_gateway, tmp_path):
    settings.GATEWAY_URL = payment_gateway.url  # the test gateway answers there: nothing to start
    out = io.StringIO()
    assert start_services(sender=None, stdout=out) == [] and out.getvalue() == ""

    settings.GATEWAY_URL = "http://gateway.internal:8765"  # another machine's to run
    assert start_services(sender=None, stdout=out) == [] and out.getvalue() == ""

    url = f"http://127.0.0.1:{free_port()}"
    settings.GATEWAY_URL, settings.GATEWAY_LEDGER = url, str(tmp_path / "ledger.sqlite3")
    stops = start_services(sender=None, stdout=out)
    try:
        assert len(stops) == 1
        _wait_for(lambda: _health(url) == 200, "the started gateway", timeout_s=15)
        assert f"Demo payment gateway started at {url}" in out.getvalue()
        assert (tmp_path / "ledger.sqlite3").exists()
    finally:
        for stop in stops:
            stop()
    _wait_for(lambda: _health(url) is None, "the gateway to stop", timeout_s=15)


def _health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code
    except httpx.TransportError:
        return None


# --- the migration pair (tools 0006, demo 0001) --------------------------------

def _migrate(targets) -> MigrationExecutor:
    """Migrate the test database to ``targets``; return a fresh executor that knows the result."""
    MigrationExecutor(connection).migrate(targets)
    return MigrationExecutor(connection)


def _tables() -> set[str]:
    return set(connection.introspection.table_names())


def _orders_before_the_move(executor) -> list[int]:
    """Make a user and two orders in the tools app's table, as before the move; return their ids."""
    apps = executor.loader.project_state(LAST_BEFORE_THE_MOVE).apps
    owner = apps.get_model("auth", "User").objects.create(username="old-customer")
    OldOrder = apps.get_model("tools", "Order")
    return [OldOrder.objects.create(number=number, owner=owner, total=Decimal(total), shipped=shipped).pk
            for number, total, shipped in ((500, "12.50", True), (501, "99.00", False))]


@pytest.fixture
def before_the_move(transactional_db):
    """The test database migrated back to just before the move (left at the latest migrations after the test)."""
    from django.contrib.contenttypes.models import ContentType

    executor = _migrate(BEFORE_THE_MOVE)
    yield executor
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    ContentType.objects.clear_cache()


def test_orders_of_a_database_migrated_before_the_move_are_kept_both_ways(before_the_move):
    from django.contrib.contenttypes.models import ContentType

    assert "tools_order" in _tables() and "demo_order" not in _tables()
    assert ContentType.objects.filter(app_label="tools", model="order").exists()
    ids = _orders_before_the_move(before_the_move)

    executor = _migrate(before_the_move.loader.graph.leaf_nodes())
    assert "tools_order" not in _tables() and "demo_order" in _tables()
    assert list(Order.objects.values_list("pk", "number", "total", "shipped", "owner__username")) == [
        (ids[0], 500, Decimal("12.50"), True, "old-customer"), (ids[1], 501, Decimal("99.00"), False, "old-customer")]
    assert Order.objects.create(number=502, owner_id=Order.objects.get(number=500).owner_id, total=1).pk > ids[1]
    assert list(ContentType.objects.filter(model="order").values_list("app_label", flat=True)) == ["demo"]

    executor = _migrate(BEFORE_THE_MOVE)
    OldOrder = executor.loader.project_state(LAST_BEFORE_THE_MOVE).apps.get_model("tools", "Order")
    assert sorted(OldOrder.objects.values_list("number", flat=True)) == [500, 501, 502]
    assert "demo_order" not in _tables()
    assert list(ContentType.objects.filter(model="order").values_list("app_label", flat=True)) == ["tools"]


def test_orders_left_by_a_product_without_the_demo_are_taken_over_when_it_is_installed(before_the_move):
    ids = _orders_before_the_move(before_the_move)
    _migrate([("tools", "0006_order_moves_to_demo"), ("demo", None)])  # the tools app moves on alone
    assert "tools_order" in _tables() and "demo_order" not in _tables()

    _migrate(before_the_move.loader.graph.leaf_nodes())
    assert "tools_order" not in _tables()
    assert list(Order.objects.values_list("pk", flat=True)) == ids


def test_the_tools_app_drops_the_orders_table_when_it_holds_no_orders(before_the_move):
    _migrate([("tools", "0006_order_moves_to_demo"), ("demo", None)])
    assert not {"tools_order", "demo_order"} & _tables()
    _migrate(before_the_move.loader.graph.leaf_nodes())
    assert "demo_order" in _tables() and not Order.objects.exists()
