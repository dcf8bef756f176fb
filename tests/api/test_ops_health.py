"""``/healthz`` and ``/readyz`` (issue 25): cheap, unauthenticated, nothing sensitive, and honest about outages.

The outages are real: a server process (``config.asgi`` under Daphne)
whose database is taken away (on SQLite its folder is moved; on
PostgreSQL a TCP relay in front of it is cut) or whose Redis is killed,
then given back.
"""

import sqlite3
import time

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client, override_settings
from rest_framework.throttling import SimpleRateThrottle

from tests.support.ops import AsgiServer, PrivateRedis, Relay, database_url_copy, have_redis_server

pytestmark = pytest.mark.django_db(transaction=True)

ALL_OK = {"database": "ok", "broker": "ok", "migrations": "ok"}


def test_both_answer_without_a_session_a_host_check_or_an_https_redirect():
    client = Client(HTTP_HOST="10.0.3.7:8000")  # a probe calls the server by its address
    with override_settings(SECURE_SSL_REDIRECT=True):  # and over plain HTTP
        alive = client.get("/healthz")
        ready = client.get("/readyz")
    assert (alive.status_code, alive.json()) == (200, {"status": "alive"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready", "checks": ALL_OK})
    for response in (alive, ready):
        assert response["Cache-Control"] == "no-store"
        assert not response.cookies  # no session, no language cookie, no CSRF token
    head = client.head("/readyz")
    assert (head.status_code, head.content) == (200, b"")
    assert client.post("/readyz").status_code == 405


def test_probes_are_never_rate_limited(monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES, "anon": "2/min"})
    cache.clear()
    client = Client()
    try:
        assert 429 in {client.get("/api/runs/").status_code for _ in range(5)}  # the anonymous rate is on
        assert {client.get(path).status_code for path in ("/readyz", "/healthz") for _ in range(5)} == {200}
    finally:
        cache.clear()


def _until(server, path, status, timeout_s=30):
    """The first answer of ``path`` with ``status`` within ``timeout_s`` (a probe asks again and again)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = server.get(path)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.3)


def test_readyz_is_503_while_the_database_is_unreachable_and_200_once_it_is_back(tmp_path):
    relay = None
    if connection.vendor == "sqlite":
        url = database_url_copy(tmp_path / "db")
        cut, restore = (lambda: (tmp_path / "db").rename(tmp_path / "away"),
                        lambda: (tmp_path / "away").rename(tmp_path / "db"))
    else:
        relay = Relay(connection.settings_dict["HOST"] or "127.0.0.1", int(connection.settings_dict["PORT"]))
        relay.start()
        url = database_url_copy(tmp_path, port=relay.port)
        cut, restore = relay.stop, relay.start
    server = AsgiServer({"DATABASE_URL": url, "REDIS_URL": "", "DATABASE_POOL_TIMEOUT_S": "2"}, tmp_path / "server.log")
    try:
        assert (_until(server, "/readyz", 200).json()) == {"status": "ready", "checks": ALL_OK}
        cut()
        down = _until(server, "/readyz", 503)
        assert (down.status_code, down.json()) == (503, {
            "status": "unavailable", "checks": {"database": "down", "broker": "ok", "migrations": "unknown"}})
        assert server.get("/healthz").status_code == 200
        restore()
        back = _until(server, "/readyz", 200)
        assert (back.status_code, back.json()) == (200, {"status": "ready", "checks": ALL_OK})
    finally:
        server.stop()
        if relay is not None:
            relay.stop()


@pytest.mark.skipif(not have_redis_server(), reason="needs redis-server")
def test_readyz_is_503_while_redis_is_down_and_200_once_it_is_back(tmp_path):
    redis = PrivateRedis(tmp_path)
    redis.start()
    server = AsgiServer({"DATABASE_URL": database_url_copy(tmp_path / "db"), "REDIS_URL": redis.url},
                        tmp_path / "server.log")
    try:
        assert _until(server, "/readyz", 200).json() == {"status": "ready", "checks": ALL_OK}
        redis.stop()
        down = _until(server, "/readyz", 503)
        assert (down.status_code, down.json()) == (503, {
            "status": "unavailable", "checks": {"database": "ok", "broker": "down", "migrations": "ok"}})
        assert server.get("/healthz").json() == {"status": "alive"}
        redis.start()
        back = _until(server, "/readyz", 200)
        assert (back.status_code, back.json()) == (200, {"status": "ready", "checks": ALL_OK})
    finally:
        server.stop()
        redis.stop()


@pytest.mark.skipif(connection.vendor != "sqlite", reason="edits a copy of the SQLite test database")
def test_readyz_is_503_while_a_migration_is_not_applied(tmp_path):
    url = database_url_copy(tmp_path / "db")
    with sqlite3.connect(url.removeprefix("sqlite:///")) as copy:  # as if `migrate` had not run the last one
        copy.execute("DELETE FROM django_migrations WHERE id = (SELECT max(id) FROM django_migrations)")
    server = AsgiServer({"DATABASE_URL": url, "REDIS_URL": ""}, tmp_path / "server.log")
    try:
        pending = server.get("/readyz")
        assert (pending.status_code, pending.json()["checks"]) == (
            503, {"database": "ok", "broker": "ok", "migrations": "pending"})
    finally:
        server.stop()
