"""Readiness: can this process do its work? The database answers, the broker answers, the migrations are applied.

Each check returns a short machine word and never the reason's text (an
error message may name hosts, users or versions): ``"ok"``, ``"down"``
(did not answer), ``"pending"`` (migrations not applied yet) or
``"unknown"`` (not checked: the database is down). The details go to
the log, at WARNING, for operators.
"""

import logging

import dramatiq
import redis
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from dramatiq.brokers.redis import RedisBroker

log = logging.getLogger(__name__)

# Seconds a broker check waits for Redis to connect and to answer.
BROKER_TIMEOUT_S = 2.0
_migrated: set[str] = set()  # aliases whose migrations were all applied once (they are not un-applied)
_probe_clients: dict[int, redis.Redis] = {}  # id(broker) -> a client with timeouts, for PING


def database(alias: str = DEFAULT_DB_ALIAS) -> str:
    """``"ok"`` if database ``alias`` answers ``SELECT 1``, else ``"down"`` (its connection is then closed, so
    the next check connects afresh)."""
    connection = connections[alias]
    try:
        connection.close_if_unusable_or_obsolete()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        log.warning("readiness: database %r did not answer: %s", alias, exc)
        try:
            connection.close()
        except DatabaseError:
            pass
        return "down"
    return "ok"


def migrations(alias: str = DEFAULT_DB_ALIAS) -> str:
    """``"ok"`` if every migration of the installed apps is applied to database ``alias``, else ``"pending"``
    (``"down"`` if the database stopped answering meanwhile).

    Reads the migration files and the applied list the first time; once all
    are applied, that is remembered for the life of the process (a
    migration is not un-applied under a running server), so later checks
    cost nothing.
    """
    if alias in _migrated:
        return "ok"
    try:
        executor = MigrationExecutor(connections[alias])
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        log.warning("readiness: reading the applied migrations of %r failed: %s", alias, exc)
        return "down"
    if pending:
        return "pending"
    _migrated.add(alias)
    return "ok"


def broker() -> str:
    """``"ok"`` if the configured Dramatiq broker answers, else ``"down"``.

    A Redis broker is sent PING on a client of its own with the broker's
    connection settings and ``BROKER_TIMEOUT_S`` timeouts (so a probe never
    hangs on a silent network); the in-process StubBroker (the embedded
    shape) is always there.
    """
    current = dramatiq.get_broker()
    if not isinstance(current, RedisBroker):
        return "ok"
    client = _probe_clients.get(id(current))
    if client is None:
        pool = current.client.connection_pool
        client = _probe_clients[id(current)] = redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class,
            **{**pool.connection_kwargs, "socket_timeout": BROKER_TIMEOUT_S,
               "socket_connect_timeout": BROKER_TIMEOUT_S}))
    try:
        client.ping()
    except redis.RedisError as exc:
        log.warning("readiness: the broker did not answer: %s", exc)
        client.connection_pool.disconnect()
        return "down"
    return "ok"


def readiness() -> tuple[bool, dict[str, str]]:
    """``(ready, {"database": ..., "broker": ..., "migrations": ...})``: ready when all three are ``"ok"``."""
    checks = {"database": database(), "broker": broker()}
    checks["migrations"] = migrations() if checks["database"] == "ok" else "unknown"
    return all(value == "ok" for value in checks.values()), checks
