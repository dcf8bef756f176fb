"""A broker thread keeps its database connection between messages (runs.engine.worker_middleware.ConnectionsMiddleware).

Each test runs the middleware's hook in a thread of its own, as a broker
thread would between two messages, and looks at that thread's connection.
"""

import threading

import pytest
from django.db import DatabaseError, connection, connections

from runs.engine.worker_middleware import ConnectionsMiddleware
from runs.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def in_a_thread(body):
    """``body()`` in a fresh thread (its own connection, closed afterwards); returns what it returned."""
    result = {}

    def run():
        try:
            result["value"] = body()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return result["value"]


def between_messages():
    """What the middleware does after one message and before the next."""
    middleware = ConnectionsMiddleware()
    middleware.after_process_message(None, None)
    middleware.before_process_message(None, None)


def test_a_connection_in_good_order_is_kept_for_the_next_message():
    def body():
        Run.objects.count()
        before = id(connection.connection)
        between_messages()
        return before, None if connection.connection is None else id(connection.connection)

    before, after = in_a_thread(body)
    assert after == before


def test_a_connection_left_in_a_transaction_is_closed():
    def body():
        Run.objects.count()
        connection.set_autocommit(False)
        between_messages()
        return connection.connection

    assert in_a_thread(body) is None


def test_a_connection_an_error_left_unusable_is_closed_and_the_next_message_connects_afresh():
    if connection.vendor != "postgresql":
        pytest.skip("a server connection that drops: PostgreSQL (SQLite's closed file is not a database error)")

    def body():
        Run.objects.count()
        connection.connection.close()  # the server went away under it
        with pytest.raises(DatabaseError):
            Run.objects.count()
        between_messages()
        closed = connection.connection is None
        return closed, Run.objects.count()

    assert in_a_thread(body) == (True, 0)


@pytest.mark.parametrize("worker_thread", [True, False])
def test_a_thread_that_submits_a_run_keeps_its_connection_only_if_it_is_a_worker_thread(people, worker_thread):
    """A Dramatiq worker thread (marked at boot by the middleware, which closes its connections when it stops)
    keeps its connection after handing a run over; any other thread hands it back to the pool, so a thread
    nobody closes holds none once its work is done."""
    if getattr(connection, "pool", None) is None:
        pytest.skip("PostgreSQL's connection pool (without one a thread's connection is its own)")
    from runs.engine import runtime
    from runs.engine.lifecycle import start_run
    from tests.support.durability import lookup_agent

    run = start_run(agent=lookup_agent(), user=people["requester"], input="look it up")
    engine = runtime.Engine(runs_in_flight=2, db_threads=1)

    def body():
        if worker_thread:
            ConnectionsMiddleware.after_worker_thread_boot(None, None)
        assert engine.submit(run.pk) is not None
        return connection.connection is not None

    assert in_a_thread(body) is worker_thread
    assert engine.wait_idle(30)
