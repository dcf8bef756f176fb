"""``DatabaseWrapper``: Django's PostgreSQL connection, whose savepoints can be left unreleased (``releases_deferred``).

Django releases a savepoint (``RELEASE SAVEPOINT``, one round trip) when its
``atomic`` block ends, whether it kept or rolled back the block's work. In
PostgreSQL a savepoint left unreleased changes nothing about what commits:
the transaction's ``COMMIT`` keeps it, a ``ROLLBACK TO`` an earlier one
drops it, and the names Django gives are never used twice on a connection.
Only the server's memory for it waits for the end of the transaction, a
little per savepoint. So a transaction that is known to be short and to
take few savepoints, a group commit (``runs.engine.group_commit``: a
savepoint per job and a few in each), may leave them all to its end and
save a statement per savepoint, about a quarter of what an engine
database thread sends.
"""

import contextlib

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    """Django's PostgreSQL ``DatabaseWrapper``; while ``deferring_releases`` is true, a savepoint block that
    ends does not release its savepoint (see the module doc)."""

    deferring_releases = False

    def _savepoint_commit(self, sid):
        if not self.deferring_releases:
            super()._savepoint_commit(sid)


@contextlib.contextmanager
def releases_deferred(alias: str = DEFAULT_DB_ALIAS):
    """Inside the block, the savepoints of this thread's connection ``alias`` are not released when their
    ``atomic`` ends: enter it inside the transaction that leaves them to its end. A connection of another
    backend (SQLite) is left as it is."""
    connection = connections[alias]
    if not isinstance(connection, DatabaseWrapper):
        yield
        return
    connection.deferring_releases = True
    try:
        yield
    finally:
        connection.deferring_releases = False
