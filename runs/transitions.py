"""The one way any state machine changes state, Run, Step, ToolCall and Interrupt alike: ``apply``.

``apply(run.start, actor="worker")`` calls the bound django-fsm transition
and, in one database transaction (joining the caller's), appends its event
to the run's log first (``runs.services.append_events``, fenced by the
worker's lease), then saves only the fields the transition changed (a run's
own transition rides on that UPDATE; another machine's row, on PostgreSQL,
on the same statement), and schedules one live push of the
run for commit (``runs.live``). The event's content is each model's
(``runs.base.fsm.FSMModel`` hooks). Several transitions of one run may
share one reservation (``EventBatch``). Order and reasons:
docs/design.md#state-machines.
"""

import copy
import pickle
from typing import Callable

from django.db import connection, transaction

from runs.base import rows
from runs.live import publish_on_commit
from runs.services import Event, RunColumns, append_events, counters_held


def _copy(value):
    """A deep copy of a JSON field's value: a pickle round trip (several times faster than
    ``copy.deepcopy`` for nested dicts and lists), ``deepcopy`` for what pickle refuses."""
    try:
        return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, TypeError, AttributeError):
        return copy.deepcopy(value)


def _values(instance) -> dict:
    """The instance's loaded concrete field values by attname; JSON values copied, so changes inside them show."""
    values = {}
    for field in instance._meta.concrete_fields:
        if field.attname in instance.__dict__:
            value = instance.__dict__[field.attname]
            values[field.attname] = _copy(value) if isinstance(value, (dict, list)) else value
    return values


def _restore(instance, before: dict) -> None:
    """Put the instance's fields back as they were (the transition's writes were refused)."""
    for field in instance._meta.concrete_fields:
        if field.attname in before and instance.__dict__.get(field.attname) != before[field.attname]:
            instance.__dict__[field.attname] = before[field.attname]
            if field.is_relation and field.is_cached(instance):
                field.delete_cached_value(instance)


def _with_own_fields(run, columns: RunColumns | None, changed: list[str], stamped: list[str], state: str,
                     from_status: str) -> RunColumns:
    """``columns`` plus a run's own transition: the fields it changed, its ``auto_now`` stamps, and its
    status still ``from_status`` (django-fsm's optimistic lock, as its ``save`` would check)."""
    values = dict(columns.values) if columns is not None else {}
    for name in changed:
        values[name] = getattr(run, name)
    for name in stamped:
        values[name] = run._meta.get_field(name).pre_save(run, add=False)
    return RunColumns(values=values, increments=columns.increments if columns is not None else {},
                      expected={**(columns.expected if columns is not None else {}), state: from_status})


class EventBatch:
    """The events of several transitions of one run, logged with one reservation of seqs, and the rows of its
    other machines those transitions changed, written by the same statement.

    ``apply(..., batch=batch)`` on another machine of ``run`` (an inbox
    item, a tool call) keeps its row's write and its event here; the run's
    own ``apply(run.<transition>, batch=batch)`` logs the events, in order,
    ahead of its own, and writes the kept rows, in one statement on
    PostgreSQL (one fenced UPDATE of the run, one INSERT, one UPDATE per
    row: ``runs.services.append_events``' ``row_writes``). Leaving the
    ``with`` block logs and writes what is left; leaving it by an exception
    writes nothing.

    A kept row is written before any other statement the connection runs
    meanwhile (``_write_rows_first``, a Django execute wrapper while rows are
    kept), so a read in between sees it as if it had been written at once,
    and a refused write raises there. Two transitions of one row make one
    write, expecting what the row held before the first.

    Only in a transaction that holds the run's row lock and that any error
    undoes whole (``apply`` raises ``TypeError`` for a batch without
    ``savepoint=False``); ``run`` must be the instance the machines log
    through (``event_run()``). After a refusal, drop the instances applied
    earlier: their new state stays in memory. Example:
    ``approvals.services.decide_interrupt``; docs/design.md#state-machines.
    """

    def __init__(self, run):
        self.run = run
        self._events: list[Event] = []
        self._writes: list[tuple] = []  # (instance, field names, expected), one per row
        self._connection = None  # the connection the wrapper is on, while rows are kept

    def __enter__(self) -> "EventBatch":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None and self._events:
            append_events(self.run, self.take(), row_writes=self.take_rows())
        self.drop_rows()

    def keep(self, run, event: Event) -> None:
        """Hold ``event`` of a transition of ``run`` for the reservation (``TypeError`` unless ``run`` is the
        batch's own instance: the counter and the live push must stay on one object)."""
        if run is not self.run:
            raise TypeError(f"an event of run {run.pk} given through another instance than the batch's "
                            f"(run {self.run.pk})")
        self._events.append(event)

    def take(self) -> list[Event]:
        """The events held so far, oldest first; the batch is empty afterwards."""
        events, self._events = self._events, []
        return events

    def keep_row(self, instance, fields: list[str]) -> None:
        """Hold the write of ``fields`` of ``instance`` (a stored machine of the run, ``FSMModel``) for the
        reservation's statement; the instance counts as stored from now on (django-fsm's optimistic lock)."""
        for n, (kept, kept_fields, expected) in enumerate(self._writes):
            if kept is instance:
                self._writes[n] = (kept, [*kept_fields, *(f for f in fields if f not in kept_fields)], expected)
                break
        else:
            self._writes.append(instance.row_write(fields))
        instance._update_initial_state()
        if self._connection is None:
            # Outermost: ``connection.execute_wrapper()`` contexts opened meanwhile push and pop after it.
            connection.execute_wrappers.insert(0, self._write_rows_first)
            self._connection = connection

    def take_rows(self) -> list[tuple]:
        """The row writes held so far (``append_events``' ``row_writes``); the batch holds none afterwards."""
        writes, self._writes = self._writes, []
        self.drop_rows()
        return writes

    def drop_rows(self) -> None:
        """Forget the row writes held (their transaction is being rolled back), and stop watching statements."""
        self._writes = []
        if self._connection is not None:
            wrappers = self._connection.execute_wrappers
            wrappers[:] = [wrapper for wrapper in wrappers if wrapper != self._write_rows_first]
            self._connection = None

    def _write_rows_first(self, execute, sql, params, many, context):
        """Django execute wrapper: write the kept rows (one UPDATE each) before another statement runs."""
        for instance, fields, expected in self.take_rows():
            if rows.update(instance, fields, expected=expected) != 1:
                raise instance.refused_write()
        return execute(sql, params, many, context)


def apply(transition, *, actor: str, reason: str = "", payload: dict | None = None, savepoint: bool = True,
          columns: RunColumns | None = None, logged_before: Callable[[object], list[Event]] | None = None,
          batch: EventBatch | None = None, inserts: Callable[[object], list] | None = None, **arguments):
    """Apply the bound transition method ``transition`` with ``arguments``, save it, log it, push it.

    ``actor`` and ``reason`` (default: the transition's name) go to the
    event; ``payload`` is added to the model's own event payload. Returns
    the instance. Raises ``TransitionNotAllowed`` (wrong source state, or a
    ``conditions=`` guard refused), ``ConcurrentTransition`` (another writer
    changed the status since the instance was loaded) and ``LeaseLost``
    (this worker's lease on the run was taken over). Then nothing is
    written, and the instance's fields are as they were (and so are the
    event counter and ``columns`` of the run instance that logs it).

    ``columns`` (``runs.services.RunColumns``): run columns written by the
    same fenced UPDATE that reserves the event's seq, so a transaction that
    also changes the run (a phase, counters) writes the run row once.
    ``logged_before(instance)``: events logged just ahead of the
    transition's own, with the same reservation and INSERT.
    ``batch`` (``EventBatch``, only with ``savepoint=False``, else
    ``TypeError``): when the instance is not the run, its row's write and
    its event wait in the batch (then ``columns`` and
    ``logged_before`` are refused: nothing would log them); the run's own
    transition logs the batch's events ahead of its own and writes its rows
    with them.
    ``inserts(instance)``: called once the transition is made in memory,
    before its event is written; returns new rows (of one model, e.g.
    ``runs.services.new_message``) stored with the event, in its statement
    on PostgreSQL (``append_events``' ``inserts``; not with a ``batch`` that
    keeps the event: ``TypeError``). They are stored on return.

    An instance not yet in the database is inserted already past the
    transition (its events name its id, so the INSERT comes first; a
    refused event still rolls it back): e.g. a tool call stored in its
    assessed status, logged ``proposed`` then the assessment by
    ``logged_before``, so the log tells the same story as two writes would.

    Inside a caller's transaction the writes go in a savepoint, so the
    caller may catch these errors and carry on. ``savepoint=False`` saves
    those two statements for a caller that never does: an error then
    dooms the caller's whole transaction (Django's ``atomic(savepoint=False)``).
    """
    if batch is not None and savepoint:
        raise TypeError("a transition logged through an EventBatch needs savepoint=False")
    instance = transition.__self__
    model = type(instance)
    state = transition._django_fsm.field
    with transaction.atomic(savepoint=savepoint):
        before = _values(instance)
        from_status = state.get_state(instance)
        new = instance._state.adding
        run_held = None  # the event run's counter and columns, if another instance than the machine's
        try:
            transition(**arguments)
            after = _values(instance)
            changed = [field.name for field in model._meta.concrete_fields
                       if field.attname in after and after[field.attname] != before.get(field.attname)]
            stamped = [field.name for field in model._meta.concrete_fields if getattr(field, "auto_now", False)]
            if new:
                instance.insert_row()
            run = instance.event_run()
            saved_with_event = run is instance and not new and not any(
                model._meta.get_field(name).is_relation for name in changed)
            if saved_with_event:  # the run's own transition: its columns ride on the event's UPDATE
                columns = _with_own_fields(instance, columns, changed, stamped, state.name, from_status)
            event = Event(type=instance.event_type, actor=actor, reason=reason or transition.__name__,
                          payload={**instance.event_payload(arguments), **(payload or {})},
                          from_status=from_status, to_status=state.get_state(instance))
            deferred = batch is not None and run is not instance
            if deferred and (columns is not None or logged_before is not None or inserts is not None):
                raise TypeError("columns, logged_before and inserts go with the run's own transition of a batch")
            written = [] if new or saved_with_event else changed + [name for name in stamped if name not in changed]
            # Another machine's row rides on its event's statement (runs.services.append_events' ``row_writes``);
            # in a batch, on the statement that logs the batch (``EventBatch.keep_row``).
            riding = instance.row_write(written) if written and run is not instance and not deferred else None
            if not deferred:
                if run is not instance:
                    run_held = counters_held(run, columns)
                earlier = batch.take() if batch is not None else []
                kept_rows = batch.take_rows() if batch is not None else []
                append_events(run, [*earlier, *(logged_before(instance) if logged_before else []), event],
                              columns=columns, row_writes=[*kept_rows, *([riding] if riding else [])],
                              inserts=inserts(instance) if inserts is not None else ())
            if saved_with_event or riding is not None:
                instance._update_initial_state()  # django-fsm's optimistic lock: this is what is stored now
            elif written and deferred:
                batch.keep_row(instance, written)
            elif written:
                instance.update_row(written)
            if deferred:
                batch.keep(run, event)
        except BaseException:
            _restore(instance, before)
            instance._state.adding = new
            for name, value in (run_held or {}).items():  # the reservation is rolled back with the rest
                setattr(run, name, value)
            raise
        instance.after_transition(from_status, before)
        publish_on_commit(run)
    return instance
