"""The runs kernel's writes: the event log, phases, the message history.

Every event goes through ``append_event``; every change of a state
machine's status goes through ``runs.transitions.apply``, which builds on
it. Each function runs in (or joins) a database transaction; work that
must only happen after commit (waking a worker, pushing to browsers) is
deferred with ``transaction.on_commit``. Starting, ending and cancelling
runs is the engine's (``runs.engine.lifecycle``).
"""

from django.db import connection
from django.db.models import F
from django.utils import timezone

from runs import lease
from runs.lease import LeaseLost, current_token, fenced
from runs.live import publish_event_on_commit, publish_on_commit
from runs.models import Message, Run, RunEvent, RunStatus
from runs.wakeups import wake_on_commit


def actor_for(user) -> str:
    """The ``RunEvent.actor`` string for a Django user: ``user:<username>``."""
    return f"user:{user.get_username()}"


def append_event(
    run: Run,
    *,
    type: str,
    actor: str,
    reason: str = "",
    payload: dict | None = None,
    from_status: str = "",
    to_status: str = "",
) -> RunEvent:
    """Append one event to ``run``'s log with the next ``seq``.

    The counter lives on the run row and is bumped with one UPDATE, which
    also serialises concurrent writers of the same run's log. In a worker
    holding the run's lease the UPDATE is fenced: raises ``LeaseLost``
    (rolling back the caller's transaction) if the lease was taken over.
    Must be called inside ``transaction.atomic``.

    ``run.last_event_seq`` in memory moves to the new ``seq`` only when it
    was ``seq - 1``, i.e. when no other writer's event came in between
    since the instance last knew the counter: a reader that finds the
    database's counter equal to the instance's knows every event since
    was appended through that instance (``runs.engine.state`` relies on it).
    Once committed, the run's event sockets are told (``runs.live``).
    """
    seq = _next_seq(run.pk)
    if seq is None:
        raise LeaseLost(f"run {run.pk}: lease lost; event {type!r} refused")
    if run.last_event_seq == seq - 1:
        run.last_event_seq = seq
    event = RunEvent.objects.create(
        run=run,
        seq=seq,
        type=type,
        actor=actor,
        reason=reason,
        payload=payload or {},
        from_status=from_status,
        to_status=to_status,
    )
    publish_event_on_commit(run.pk, seq)
    return event


def _next_seq(run_id: int) -> int | None:
    """Add one to the run's ``last_event_seq`` (fenced by this thread's lease); the new value, None if refused.

    One statement (``UPDATE ... RETURNING``) where the database can return
    rows from a write (PostgreSQL; SQLite 3.35+), else an UPDATE and a SELECT.
    """
    if not connection.features.can_return_columns_from_insert:
        if fenced(Run.objects.filter(pk=run_id), run_id).update(last_event_seq=F("last_event_seq") + 1) != 1:
            return None
        return Run.objects.values_list("last_event_seq", flat=True).get(pk=run_id)
    quote = connection.ops.quote_name
    meta = Run._meta
    seq, pk, token_column = (quote(meta.get_field(name).column) for name in ("last_event_seq", "id", "lease_token"))
    sql = f"UPDATE {quote(meta.db_table)} SET {seq} = {seq} + 1 WHERE {pk} = %s"
    params = [run_id]
    token = current_token(run_id)
    if token is not None:
        sql += f" AND {token_column} = %s"
        params.append(token)
    with connection.cursor() as cursor:
        cursor.execute(sql + f" RETURNING {seq}", params)
        row = cursor.fetchone()
    return row[0] if row else None


def set_phase(run: Run, phase: str) -> None:
    """Record a new ``phase`` of a running run (no event: phases are detail)."""
    now = timezone.now()
    if fenced(Run.objects.filter(pk=run.pk), run.pk).update(phase=phase, updated_at=now) != 1:
        raise LeaseLost(f"run {run.pk}: lease lost; phase {phase!r} refused")
    run.phase, run.updated_at = phase, now
    publish_on_commit(run)


def append_message(run: Run, *, role: str, content: str = "", tool_calls=None, tool_call_id: str = "",
                   fence: bool = True) -> Message:
    """Append one message to the session history of ``run`` (never edited later).

    Raises ``LeaseLost`` in a worker whose lease on the run was taken over.
    ``fence=False`` leaves that check to the caller's transaction, which
    must make a fenced write of its own for the run (e.g. ``append_event``):
    one fenced statement anywhere in a transaction keeps all of it from
    committing once the lease has changed hands.
    """
    if fence:
        lease.check(run.pk)
    return Message.objects.create(
        session_id=run.session_id,
        run=run,
        role=role,
        content=content,
        tool_calls=tool_calls or [],
        tool_call_id=tool_call_id,
    )


def wake_next_in_session(session_id: int) -> None:
    """Wake a worker for the oldest queued run of the session (called when a run ends)."""
    following = Run.objects.filter(session_id=session_id, status=RunStatus.QUEUED).order_by("id").first()
    if following is not None:
        wake_on_commit(following.pk)


