"""Django's PostgreSQL backend (``django.db.backends.postgresql``) with nested savepoints released by their parent.

``ENGINE = "runs.base.postgresql"`` (config/settings.py sets it for a
``postgres://`` ``DATABASE_URL``): everything is Django's own backend,
subclassed as Django's documentation allows ("Subclassing the built-in
database backends"), except that inside ``releasing_nested_by_parent()``
the end of a nested ``transaction.atomic`` block sends no ``RELEASE
SAVEPOINT``.

Why that is sound: PostgreSQL's ``RELEASE SAVEPOINT`` of a savepoint, and
its ``ROLLBACK TO SAVEPOINT``, also destroy every savepoint made after it
(and COMMIT all of them), so a nested savepoint left open is released
with its parent, and still rolled back on its own if a later block
rolls it back. Django's transaction bookkeeping does not need the
release (its Oracle backend never sends one), with one difference: a
block that catches a database error inside itself and ends well used to
fail at its release; the error now shows at the job's next statement
(the transaction is aborted), or at its end, where the group commit
fails the job alone (``_JobSavepoints``). The group commit
(``runs.engine.group_commit``) runs each job in a savepoint that the next
job's statement releases, so a job's nested blocks (a transition's own
savepoint, ``runs.tx.locked``'s) go with it, which saves one round
trip per nested block, about one statement per step under load. Only
there: in a long transaction (an API call deciding many items) each open
savepoint would deepen the nesting of the writes after it, and each level
a write is nested in takes a subtransaction id (past 64 per transaction,
every session's snapshots read ``pg_subtrans``); a job has a handful.
"""

import contextlib

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    """Django's PostgreSQL connection wrapper; ``releasing_nested_by_parent()`` (see the module)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._release_by_parent = False
        # The savepoints made inside the last ``releasing_nested_by_parent()`` that still exist, oldest first.
        self.left_open: list[str] = []

    @contextlib.contextmanager
    def releasing_nested_by_parent(self):
        """While inside, a nested ``atomic`` block that ends well leaves its savepoint for the enclosing savepoint's
        release (or the transaction's end) to release. Use it only around code that runs in a savepoint of its
        own, released soon after (a group commit's job), or whose caller releases ``left_open[0]`` (the oldest
        savepoint made inside that still exists, which takes the later ones with it) soon after."""
        previous, self._release_by_parent = self._release_by_parent, True
        self.left_open = []
        try:
            yield
        finally:
            self._release_by_parent = previous

    def _savepoint(self, sid):
        super()._savepoint(sid)
        if self._release_by_parent:
            self.left_open.append(sid)

    def _savepoint_rollback(self, sid):
        super()._savepoint_rollback(sid)
        if self._release_by_parent:  # the savepoints made after ``sid`` are gone; ``sid`` stays
            kept = self.left_open.index(sid) + 1 if sid in self.left_open else 0
            del self.left_open[kept:]

    def _savepoint_commit(self, sid):
        if not self._release_by_parent:
            super()._savepoint_commit(sid)
