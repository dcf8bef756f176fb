"""One transaction on one run, as an object: ``RunTx``, opened by ``locked``, ``locked_many`` or ``relock``.

This module holds the run row's lock, written once. A writer that changes a
run together with rows of its own (an inbox item, a tool call, a wait) does
it inside ``with locked(run_id) as tx:`` and goes through ``tx``:

- ``tx.run``: the run, as locked (``SELECT ... FOR UPDATE``); every row of the
  run that logs an event must log it through this very instance;
- ``tx.cache``: a dict where each layer keeps the rows it loaded under the
  lock, under keys of its own (the kernel knows no tool or item model);
- ``tx.apply(bound_transition, actor=, reason=, payload=, **kw)``: a
  transition of the run or of one of its rows (``runs.transitions.apply``
  without a savepoint); another row's write and event wait for the run's
  next transition or the end of the block, so they share one reservation
  and, on PostgreSQL, one statement (a statement run in between writes
  the row first: ``runs.transitions.EventBatch``);
- ``tx.log(type=, actor=, ...)``: an event of the run, kept the same way;
- ``tx.set(**values)``: run columns written by the same fenced UPDATE that
  reserves the events' seqs (``runs.services.RunColumns``);
- ``tx.message(role=, ...)``: a message of the run's session history;
- ``tx.wake()``: a worker is woken for the run once the transaction commits.

Leaving the block writes what is left: one fenced UPDATE (the event counter
and the columns) and one INSERT (the events) (``runs.services.append_events``).
Leaving it by an exception writes nothing and undoes the block whole (its
own ``transaction.atomic``, a savepoint when nested): do not catch errors of
its writes inside the block, as the writes take no savepoint of their own.

Lock order, so two writers never wait on each other in a circle: the run
row first, then its own rows (items, tool calls, waits); several runs in id
order, in one statement (``locked_many``); policy locks
(``tools.models.PolicyLock``) in key order. A writer holding a policy lock
takes other runs' rows only with ``skip_locked`` (a target's release waking
its waiters): under group commit (``runs.engine.group_commit``) a
transaction holds the rows of all its runs, taken in no particular order.
Whoever takes a policy lock says so (``note_shared_lock``), so that a group
commits it before another run's job may wait for one.

Under a worker's lease every write of the block is fenced (``runs.lease``):
once the lease has changed hands, the block's UPDATE matches no row and
``LeaseLost`` undoes it.

After commit, the wake-up goes before the live push (a worker need not
wait for browsers): the wake-up's commit hook is queued when the block
opens, ahead of any push its transitions queue (``runs.live``).

The idea is Prefect's ``OrchestrationContext`` (one object carries a state
change's context, validated and committed together) and Zulip's "call this
while holding the lock" contract, made into a type.
"""

import contextlib
import contextvars

from django.db import transaction

from runs import lease
from runs.base import rows, selects
from runs.models import Message, Run
from runs.services import Event, RunColumns, append_events, new_message
from runs.transitions import EventBatch, apply
from runs.wakeups import wake_now


_shared_lock = contextvars.ContextVar("tollgate_shared_lock", default=False)


def note_shared_lock() -> None:
    """Note, in the current context, that its transaction now holds a lock that other runs' writers take
    too (a policy lock, ``tools.models.PolicyLock``)."""
    _shared_lock.set(True)


def clear_shared_lock() -> None:
    """Forget, in the current context, any such note: a fresh job's context starts without one."""
    _shared_lock.set(False)


def holds_shared_lock(context: contextvars.Context) -> bool:
    """Whether work run in ``context`` (``contextvars.Context.run``) called ``note_shared_lock``."""
    return context.get(_shared_lock, False)


class RunTx:
    """What one transaction does on one locked run (see the module doc): built by ``locked``/``locked_many``.

    ``run``: the locked ``Run``; ``cache``: the layers' rows loaded under
    the lock (``{key: anything}``, keys chosen by each layer, e.g.
    ``tools.waits.DUE``).
    """

    def __init__(self, run: Run):
        self.run = run
        self.cache: dict = {}
        self._batch = EventBatch(run)
        self._values: dict = {}
        self._fenced = False  # a fenced write of the run reached the database in this block
        self._messages = False  # a message was written, which the block's fenced write must cover
        self._wake = False

    def apply(self, transition, *, actor: str, reason: str = "", payload: dict | None = None, **arguments):
        """Apply the bound ``transition`` of the run or of a row of it; returns the instance.

        The run's own logs the kept events ahead of its own and writes ``set``'s columns and the kept rows in the
        same statement; another row's write and event are kept. Raises what ``runs.transitions.apply`` raises (``TransitionNotAllowed``,
        ``ConcurrentTransition``, ``LeaseLost``), which undoes the block.
        """
        run_own = transition.__self__ is self.run
        columns = self._take_columns() if run_own else None
        instance = apply(transition, actor=actor, reason=reason, payload=payload, savepoint=False,
                         columns=columns, batch=self._batch, **arguments)
        self._fenced = self._fenced or run_own
        return instance

    def log(self, *, type: str, actor: str, reason: str = "", payload: dict | None = None, from_status: str = "",
            to_status: str = "") -> None:
        """Keep an event of the run (``runs.services.Event``'s fields) for the block's next reservation."""
        self._batch.keep(self.run, Event(type=type, actor=actor, reason=reason, payload=payload,
                                         from_status=from_status, to_status=to_status))

    def set(self, **values) -> None:
        """Run columns to write with the block's next reservation (``RunColumns.values``); the instance
        shows them once written. Not ``status`` (a transition's) nor ``last_event_seq`` (``TypeError`` then)."""
        self._values.update(values)

    def message(self, *, role: str, content: str = "", tool_calls=None, tool_call_id: str = "") -> Message:
        """Append a message to the run's session history at once; returns it.

        Fenced by the block's own UPDATE; a block that writes no event
        checks the lease when it ends (``runs.lease.check``) instead.
        """
        self._messages = True
        return rows.insert(new_message(self.run, role=role, content=content, tool_calls=tool_calls,
                                       tool_call_id=tool_call_id))

    def wake(self) -> None:
        """Wake a worker for the run once the transaction commits, before its live push (never on rollback)."""
        self._wake = True

    def _take_columns(self) -> RunColumns | None:
        if not self._values:
            return None
        columns, self._values = RunColumns(values=self._values), {}
        return columns

    def _open(self) -> None:
        transaction.on_commit(self._on_commit, robust=True)

    def _on_commit(self) -> None:
        if self._wake:
            wake_now(self.run.pk)

    def _drop(self) -> None:
        """Forget what the block kept unwritten (it is being undone, or was written)."""
        self._batch.drop_rows()

    def _close(self) -> None:
        """Write what the block left: its kept events and columns (one UPDATE, one INSERT), or check
        the lease for a block whose only writes were messages."""
        events, columns, writes = self._batch.take(), self._take_columns(), self._batch.take_rows()
        if events or columns is not None:
            if not events:
                raise TypeError(f"run {self.run.pk}: columns set with no event to carry them")
            append_events(self.run, events, columns=columns, row_writes=writes)
        elif self._messages and not self._fenced:
            lease.check(self.run.pk)


def _rows(related: tuple[str, ...], skip_locked: bool = False):
    """Run rows to lock (``SELECT ... FOR UPDATE [SKIP LOCKED]``); ``related``: foreign keys read along, not locked."""
    if related:
        return Run.objects.select_for_update(of=("self",), skip_locked=skip_locked).select_related(*related)
    return Run.objects.select_for_update(skip_locked=skip_locked)


@contextlib.contextmanager
def locked(run_id: int, *, related: tuple[str, ...] = ()):
    """``with locked(run_id) as tx:``: a transaction holding the run's row lock (one ``SELECT ... FOR UPDATE``), as a ``RunTx``.

    ``related``: foreign keys read along, not locked. Raises ``Run.DoesNotExist``. Leaving the block writes: the module doc.
    """
    with transaction.atomic():
        tx = RunTx(selects.select_one(Run, {"pk": run_id}, related=related, for_update=True))
        tx._open()
        try:
            yield tx
            tx._close()
        finally:
            tx._drop()


@contextlib.contextmanager
def locked_many(run_ids, *, related: tuple[str, ...] = (), skip_locked: bool = False):
    """``with locked_many(run_ids) as txs:``: ``{run id: RunTx}`` of the runs that still exist, in id order.

    Their row locks are taken in id order in one statement, so that a
    writer of many runs (the sweeper) and writers of one never wait on
    each other in a circle. ``related``: as in ``locked``. ``skip_locked``:
    leave out the runs whose row another transaction holds instead of
    waiting for it (``SKIP LOCKED``; SQLite has none and needs none: its
    writers are serialized). Leaving the block closes each ``RunTx`` in id order.
    """
    with transaction.atomic():
        txs = {run.pk: RunTx(run) for run in _rows(related, skip_locked).filter(pk__in=run_ids).order_by("pk")}
        for tx in txs.values():
            tx._open()
        try:
            yield txs
            for tx in txs.values():
                tx._close()
        finally:
            for tx in txs.values():
                tx._drop()


def relock(run: Run) -> bool:
    """Lock the row of ``run`` (a leased worker's instance) inside the caller's transaction (Zulip's "while holding the
    lock" contract), without loading it again. Re-reads ``cancel_requested_at``; True when no other writer logged an
    event since. Raises ``Run.DoesNotExist``.
    """
    cancel_requested_at, seq = selects.values_one(Run, {"pk": run.pk}, ("cancel_requested_at", "last_event_seq"),
                                                  for_update=True)
    run.cancel_requested_at = cancel_requested_at
    return seq == run.last_event_seq
