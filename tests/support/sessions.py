"""Two PostgreSQL sessions at once: for tests of writers that must never wait on each other in a circle.

* ``in_session(errors, name, fn)``: a started thread running ``fn()`` on a
  database session of its own; what it raises goes to ``errors[name]``;
* ``wait_for_a_lock_wait(statement_start)``: block (at most 20 s, then
  ``AssertionError``) until some session's statement starting with
  ``statement_start`` waits for a lock (``pg_stat_activity``);
* ``group_writing(errors, later=, earlier=)``: a session writing two runs'
  rows as a worker's group commit may, later run first.
"""

import contextlib
import threading
import time

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from runs.models import Phase, Run


def in_session(errors: dict, name: str, fn) -> threading.Thread:
    """A started thread running ``fn()`` on a database session of its own; what it raises goes to ``errors[name]``."""
    def body():
        try:
            fn()
        except Exception as exc:
            errors[name] = exc
        finally:
            connection.close()
    thread = threading.Thread(target=body)
    thread.start()
    return thread


def wait_for_a_lock_wait(statement_start: str) -> None:
    """Block until a session's statement starting with ``statement_start`` waits for a lock."""
    watcher = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        deadline = time.monotonic() + 20
        while True:
            with watcher.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock' AND query LIKE %s", [statement_start + "%"])
                if cursor.fetchone()[0]:
                    return
            assert time.monotonic() < deadline, f"no {statement_start} statement ever waited for a lock"
            time.sleep(0.02)
    finally:
        watcher.close()


@contextlib.contextmanager
def group_writing(errors: dict, *, later: int, earlier: int):
    """``with group_writing(errors, later=..., earlier=...) as go:``: a session that, as a worker's group commit may
    (its runs' rows taken in job order), writes run ``later``'s row, holds it, and once ``go()`` is called (at the
    latest when the block ends) writes run ``earlier``'s, then commits; joined on exit. Its error goes to
    ``errors["group"]``."""
    holds_the_row, going = threading.Event(), threading.Event()

    def group():
        with transaction.atomic():
            Run.objects.filter(pk=later).update(phase=Phase.CALLING_MODEL)  # a job of the later run
            holds_the_row.set()
            going.wait(20)
            Run.objects.filter(pk=earlier).update(phase=Phase.CALLING_MODEL)  # the next job, of the earlier run

    grouped = in_session(errors, "group", group)
    try:
        assert holds_the_row.wait(20)
        yield going.set
    finally:
        going.set()
        grouped.join()
