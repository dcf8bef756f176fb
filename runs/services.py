"""The runs kernel's writes: the event log, phases, the message history.

Every event goes through ``append_events`` (``append_event`` for one),
which reserves a transaction's seqs and writes its run columns in one
fenced UPDATE; every change of a state machine's status goes through
``runs.transitions.apply``, which builds on it. Each function runs in (or
joins) a database transaction; work that must only happen after commit
(waking a worker, pushing to browsers) is deferred with
``transaction.on_commit``. Starting, ending and cancelling
runs is the engine's (``runs.engine.lifecycle``).
"""

import dataclasses
import weakref

from django.db import connection, transaction
from django.db.models import F, Model, Q
from django.db.models.signals import post_save
from django.utils import timezone
from django_fsm import ConcurrentTransition

from runs import lease
from runs.base.rows import insert as insert_row
from runs.base.rows import insert_many as insert_rows
from runs.base.rows import update as update_row
from runs.base.rows import update_and_insert_numbered, update_and_insert_one, update_columns
from runs.base.awaiting import current_resumption
from runs.lease import LeaseLost, current_token, fenced
from runs.live import publish_event_on_commit, publish_on_commit
from runs.models import Message, Run, RunEvent, RunStatus
from runs.wakeups import wake_on_commit


def actor_for(user) -> str:
    """The ``RunEvent.actor`` string for a Django user: ``user:<username>``."""
    return f"user:{user.get_username()}"


@dataclasses.dataclass(frozen=True)
class Event:
    """One event for ``append_events``: the columns of a ``RunEvent`` the caller chooses (not ``run``, ``seq``)."""

    type: str
    actor: str
    reason: str = ""
    payload: dict | None = None
    from_status: str = ""
    to_status: str = ""


@dataclasses.dataclass(frozen=True)
class RunColumns:
    """Run columns written by the same fenced UPDATE that reserves the events' seqs (concrete, non-relational ``Run`` fields).

    ``values``: field -> new value (set on the instance too); ``increments``: field -> number added to row and instance;
    ``expected``: field -> value the row must still hold, else nothing is written (optimistic locking).
    Raises ``TypeError`` for ``last_event_seq`` (``append_events`` moves it).
    """

    values: dict = dataclasses.field(default_factory=dict)
    increments: dict = dataclasses.field(default_factory=dict)
    expected: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if "last_event_seq" in self.values or "last_event_seq" in self.increments:
            raise TypeError("last_event_seq is the event counter: append_events moves it")


def counters_held(run: Run, columns: RunColumns | None) -> dict:
    """``{field name: value}`` of ``run``'s instance for what an ``append_events`` with ``columns`` moves
    (the event counter, the columns' values and increments): to put back after a refusal."""
    names = ["last_event_seq", *(columns.values if columns else ()), *(columns.increments if columns else ())]
    return {name: getattr(run, name) for name in names}


def append_event(
    run: Run,
    *,
    type: str,
    actor: str,
    reason: str = "",
    payload: dict | None = None,
    from_status: str = "",
    to_status: str = "",
    columns: RunColumns | None = None,
) -> RunEvent:
    """Append one event to ``run``'s log with the next ``seq``; returns it (``append_events`` of one)."""
    event = Event(type=type, actor=actor, reason=reason, payload=payload, from_status=from_status, to_status=to_status)
    return append_events(run, [event], columns=columns)[0]


def append_events(run: Run, events: list[Event], *, columns: RunColumns | None = None,
                  row_writes: list[tuple] = (), inserts: list[Model] = ()) -> list[RunEvent]:
    """Append ``events`` (at least one) to ``run``'s log, in order, with the next seqs; returns them saved.

    The counter lives on the run row: one UPDATE adds ``len(events)`` to it
    (and writes ``columns``, if given, in the same statement), then one
    INSERT stores the events (on PostgreSQL, both in one statement), so a
    transaction that changes the run and logs what it did writes the run
    row once. The UPDATE also serialises
    concurrent writers of the same run's log, so the seqs stay gapless and
    in commit order. In a worker holding the run's lease it is fenced:
    raises ``LeaseLost`` (rolling back the caller's transaction) if the
    lease was taken over. With ``columns.expected``, raises
    ``ConcurrentTransition`` if the row no longer holds those values (and
    the lease, if any, is still this worker's). Then nothing is written.
    Must be called inside ``transaction.atomic``.

    ``run.last_event_seq`` in memory moves to the last new ``seq`` only when
    it was just below the first, i.e. when no other writer's event came in
    between since the instance last knew the counter: a reader that finds
    the database's counter equal to the instance's knows every event since
    was appended through that instance (``runs.engine.state`` relies on it).
    If the events' INSERT is refused, the instance's counter and ``columns``
    are put back as they were (the caller's rollback undoes the reservation).
    Each event is announced with ``post_save`` (created), as ``save()``
    would (the webhook outbox listens), and, once committed, the run's
    event sockets are told (``runs.live``).

    ``row_writes``: ``FSMModel.row_write(fields)`` of other machines of the
    run (a tool call, a step, an inbox item; one write per row), written
    with the events: on PostgreSQL in the same statement, after the run's
    row; elsewhere right after them. If one no longer holds what it was
    loaded with, raises what its ``FSMModel.refused_write`` says
    (``ConcurrentTransition``, or ``DatabaseError`` if it is gone) and the
    caller rolls back.

    ``inserts``: new rows of one model (none stored; e.g. ``new_message``'s) inserted with the events, on
    PostgreSQL by the same statement, elsewhere right after them; stored (keys set) on return. Fenced by the
    reservation: no ``lease.check`` of their own.
    """
    if columns is not None and columns.values.get("status", run.status) != run.status:
        raise TypeError("a run's status changes only through runs.transitions.apply (which sets it first)")
    rows = [RunEvent(run=run, type=event.type, actor=event.actor, reason=event.reason, payload=event.payload or {},
                     from_status=event.from_status, to_status=event.to_status) for event in events]
    held = counters_held(run, columns)
    combined = connection.vendor == "postgresql"  # the reservation, the INSERT and ``row_writes`` in one statement
    last = (_reserve(run, len(events), columns, rows=rows, also=row_writes, extra=inserts) if combined
            else _reserve(run, len(events), columns))
    if last is None:
        refused = ", ".join(repr(e.type) for e in events)
        held_still = _lease_still_held(run.pk)
        refused_row = _refused_row(row_writes) if held_still and combined else None
        if refused_row is not None:  # a row was refused (else the run's expected columns were)
            raise refused_row.refused_write()
        if columns is not None and columns.expected and held_still:
            raise ConcurrentTransition(f"run {run.pk} changed meanwhile; {refused} refused")
        raise LeaseLost(f"run {run.pk}: lease lost; {refused} refused")
    first = last - len(events) + 1
    _last_writer[run.pk] = run
    run._logged_in = current_resumption()  # writes_held
    if run.last_event_seq == first - 1:
        run.last_event_seq = last
        run._counter_confirmed = _confirmation(last)
    else:
        run._counter_confirmed = None
    if columns is not None:
        for name, value in columns.values.items():
            if getattr(run, name) != value:  # a transition's own fields are set already
                setattr(run, name, value)
        for name, amount in columns.increments.items():
            setattr(run, name, getattr(run, name) + amount)
    try:
        if rows[0].pk is None:  # reserved only: the events go in now, then ``row``
            for seq, event in enumerate(rows, start=first):
                event.seq = seq
            insert_rows(rows)  # one statement, built once per number of rows (runs.base.rows)
            for instance, fields, expected in row_writes:
                if update_row(instance, fields, expected=expected) != 1:
                    raise instance.refused_write()
            if inserts:
                insert_rows(list(inserts))
        announce_events(rows)  # neither statement sends a signal
    except BaseException:
        # What the instance held, put back: the caller's savepoint rolls the reservation back, and a
        # counter left ahead would later hide another writer's event.
        for name, value in held.items():
            setattr(run, name, value)
        run._counter_confirmed = None
        raise
    return rows


def announce_events(events: list[RunEvent]) -> None:
    """Announce stored ``events`` (of one run or many, in seq order per run) as ``save()`` would: ``post_save``
    (created; the webhook outbox listens), and, once committed, tell each run's event sockets of its last one
    (``runs.live.publish_event_on_commit``). For writers that store events without ``save()``."""
    last = {}
    for event in events:
        post_save.send(sender=RunEvent, instance=event, created=True, update_fields=None, raw=False,
                       using=event._state.db)
        last[event.run_id] = event.seq
    for run_id, seq in last.items():
        publish_event_on_commit(run_id, seq)


# Run id -> the instance through which this process last appended events to the run (``counter_confirmed``).
_last_writer: "weakref.WeakValueDictionary[int, Run]" = weakref.WeakValueDictionary()


class _Reserved:
    """A no-op commit hook (``transaction.on_commit``) standing for one reservation: Django drops it when its
    transaction commits or rolls back, or the savepoint it was made in rolls back (``counter_confirmed``)."""

    __slots__ = ()

    def __call__(self) -> None:
        pass


def _confirmation(last: int) -> tuple | None:
    """What ``counter_confirmed`` checks of a reservation that moved the instance's counter to ``last``: the
    counter, the stretch of code (``current_resumption``), and a commit hook of its transaction with its place
    among the connection's hooks; None outside a transaction (then nothing holds the row's lock)."""
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        return None
    marker = _Reserved()
    transaction.on_commit(marker)
    return last, current_resumption(), marker, len(connection.run_on_commit) - 1


def counter_confirmed(run: Run) -> bool:
    """Whether ``run.last_event_seq`` is the row's without reading it: the last events appended to the run in
    this process went through this instance (``append_events``), found no other writer's event before them,
    no ``Await`` came since (the same ``runs.base.awaiting.resume``), and the transaction that reserved them
    is still open, that reservation not rolled back (a group commit's, ``runs.engine.group_commit``).

    The reservation read the row's counter under the row's lock (its fenced UPDATE ``RETURNING`` it), and
    the transaction holds that lock until it ends, so no other connection can have logged an event since;
    on this connection, only through another instance (``_last_writer``). Once that transaction committed
    the lock is gone, and the stretch of code may have waited on other rows since (commit hooks that wake
    a target's waiters, ``relock``), so the counter is read again (``runs.engine.state.Known.revalidate``).
    Always False outside a resumed step (``current_resumption`` None).
    """
    token, confirmed = current_resumption(), getattr(run, "_counter_confirmed", None)
    if token is None or confirmed is None or _last_writer.get(run.pk) is not run:
        return False
    last, resumption, marker, place = confirmed
    if (last, resumption) != (run.last_event_seq, token):
        return False
    connection = transaction.get_connection()
    hooks = connection.run_on_commit
    return connection.in_atomic_block and place < len(hooks) and hooks[place][1] is marker


def writes_held(run: Run) -> bool:
    """Whether this stretch of a step (``runs.base.awaiting.current_resumption``) logged events of ``run``
    (``append_events``) that a transaction around it still holds, a group commit's (``runs.engine.group_commit``):
    a failure later in that transaction would undo them, and ``yield commit_point()`` commits them first. False
    where each transaction commits as it ends (a lone job, ``runs.base.awaiting.drive``) and outside a step."""
    token = current_resumption()
    return (token is not None and getattr(run, "_logged_in", None) is token
            and transaction.get_connection().in_atomic_block)


def _reserve(run: Run, count: int, columns: RunColumns | None, *, rows: list[RunEvent] | None = None,
             also: list[tuple] = (), extra: list[Model] = ()) -> int | None:
    """Add ``count`` to the run's ``last_event_seq`` and write ``columns``, fenced by this thread's lease.

    Returns the new counter, or None if the row was not written (the lease
    was taken over, an expected value changed, or the run is gone). One
    statement (``UPDATE ... RETURNING``) where the database can return rows
    from a write (PostgreSQL; SQLite 3.35+), else an UPDATE and a SELECT.
    With ``rows`` (PostgreSQL only), the same statement inserts them as the
    events of the reserved seqs, writes ``also`` (``append_events``' ``row_writes``) and inserts ``extra``
    (its ``inserts``) (``runs.base.rows.update_and_insert_numbered``).
    """
    values = columns.values if columns is not None else {}
    others = columns.increments if columns is not None else {}
    increments = {"last_event_seq": count, **others}
    expected = columns.expected if columns is not None else {}
    if not connection.features.can_return_columns_from_insert:
        written = fenced(Run.objects.filter(pk=run.pk, **expected), run.pk).update(
            **values, **{name: F(name) + amount for name, amount in increments.items()})
        if written != 1:
            return None
        return Run.objects.values_list("last_event_seq", flat=True).get(pk=run.pk)
    token = current_token(run.pk)
    if token is not None:
        expected = {**expected, "lease_token": token}
    if rows is not None:
        return update_and_insert_numbered(Run, run.pk, values=values, increments=others, expected=expected,
                                          counted="last_event_seq", instances=rows, position="seq", also=also,
                                          extra=extra)
    return update_columns(Run, run.pk, values=values, increments=increments, expected=expected,
                          returning="last_event_seq")


def _refused_row(row_writes: list[tuple]):
    """The instance of the first of ``row_writes`` that the refused statement did not write: its row holds neither
    what the write expected nor what it was to write (the statement writes the rows before the one it refuses),
    or is gone; None if each holds one of them. One query per write looked at; only after a refused statement."""
    for instance, _fields, expected in row_writes:
        meant = {name: getattr(instance, name) for name in expected}
        if not type(instance)._base_manager.filter(Q(**expected) | Q(**meant), pk=instance.pk).exists():
            return instance
    return None


def _lease_still_held(run_id: int) -> bool:
    """Whether the run's row still carries this thread's lease token (True when it holds none)."""
    token = current_token(run_id)
    return token is None or Run.objects.filter(pk=run_id, lease_token=token).exists()


def set_phase(run: Run, phase: str, *, insert: Model | None = None) -> None:
    """Record a new ``phase`` of a running run (no event: phases are detail), fenced by this thread's lease.

    ``insert``: a row (not stored) inserted only if the phase was written; on PostgreSQL in the same statement
    (``runs.base.rows.update_and_insert_one``), so that, outside a transaction, the two are one. Raises
    ``LeaseLost`` (nothing written) if the lease was taken over.
    """
    token, held = current_token(run.pk), (run.phase, run.updated_at)
    run.phase = phase
    expected = {} if token is None else {"lease_token": token}
    try:
        if insert is not None and connection.vendor == "postgresql":
            run.updated_at = timezone.now()  # auto_now, as update_row stamps it
            written = update_and_insert_one(Run, run.pk, values={"phase": phase, "updated_at": run.updated_at},
                                            expected=expected, instance=insert)
        elif insert is not None:
            with transaction.atomic():
                written = update_row(run, ["phase", "updated_at"], expected=expected) == 1
                if written:
                    insert_row(insert)
        else:
            written = update_row(run, ["phase", "updated_at"], expected=expected) == 1
        if not written:
            raise LeaseLost(f"run {run.pk}: lease lost; phase {phase!r} refused")
    except BaseException:  # nothing was written: the instance says so too
        run.phase, run.updated_at = held
        raise
    publish_on_commit(run)


def append_message(run: Run, *, role: str, content: str = "", tool_calls=None, tool_call_id: str = "",
                   fence: bool = True) -> Message:
    """Append one message to the session history of ``run`` (never edited later); returns it.

    Raises ``LeaseLost`` in a worker whose lease was taken over. ``fence=False``: the caller's transaction makes a fenced
    write of its own for the run (one fenced statement keeps the whole transaction from committing).
    """
    if fence:
        lease.check(run.pk)
    return insert_row(new_message(run, role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id))


def new_message(run: Run, *, role: str, content: str = "", tool_calls=None, tool_call_id: str = "") -> Message:
    """A message of ``run``'s session history, not stored yet: for ``append_events``' ``inserts`` (stored with
    the events that tell what it records) or ``append_message``."""
    return Message(session_id=run.session_id, run=run, role=role, content=content, tool_calls=tool_calls or [],
                   tool_call_id=tool_call_id)


def wake_next_in_session(session_id: int) -> None:
    """Wake a worker for the oldest queued run of the session (called when a run ends)."""
    following = Run.objects.filter(session_id=session_id, status=RunStatus.QUEUED).order_by("id").first()
    if following is not None:
        wake_on_commit(following.pk)


