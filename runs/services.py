"""The runs kernel's writes: transitions, the event log, phases, the message history.

Every change of a run's status goes through ``transition_run``, and every
event through ``append_event``; the tools and approvals services and the
engine build on these. Each function runs in (or joins) a database
transaction; work that must only happen after commit (waking a worker,
pushing to browsers) is deferred with ``transaction.on_commit``. Starting,
ending and cancelling runs is the engine's (``runs.engine.lifecycle``).
"""

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs import lease
from runs.lease import LeaseLost, fenced
from runs.live import publish_run_update
from runs.models import Message, Run, RunEvent, RunStatus
from runs.wakeups import wake_on_commit


# Fields a transition may change; saving only these never overwrites a
# concurrent writer's other fields (e.g. cancel_requested_at).
TRANSITION_FIELDS = [
    "status", "phase", "waiting_reason", "wake_at", "failure_type", "outcome", "outcome_reason",
    "error", "final_output", "started_at", "finished_at", "updated_at",
]


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
    """
    if fenced(Run.objects.filter(pk=run.pk), run.pk).update(last_event_seq=F("last_event_seq") + 1) != 1:
        raise LeaseLost(f"run {run.pk}: lease lost; event {type!r} refused")
    seq = Run.objects.values_list("last_event_seq", flat=True).get(pk=run.pk)
    run.last_event_seq = seq
    return RunEvent.objects.create(
        run=run,
        seq=seq,
        type=type,
        actor=actor,
        reason=reason,
        payload=payload or {},
        from_status=from_status,
        to_status=to_status,
    )


def transition_run(run: Run, name: str, *, actor: str, reason: str = "", event_payload: dict | None = None,
                   **kwargs) -> Run:
    """Apply the FSM transition ``name`` (e.g. ``"wait"``) to ``run`` and record it.

    ``kwargs`` go to the transition method; ``event_payload`` is added to the event's payload. Raises
    ``django_fsm.TransitionNotAllowed`` for an illegal transition and
    ``django_fsm.ConcurrentTransition`` when another writer changed the
    status since ``run`` was loaded; nothing is written in either case.
    """
    with transaction.atomic():
        from_status = run.status
        getattr(run, name)(**kwargs)
        if run.is_terminal:
            run.finished_at = timezone.now()
        elif run.status == RunStatus.RUNNING and run.started_at is None:
            run.started_at = timezone.now()
        run.save(update_fields=TRANSITION_FIELDS)
        payload = {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool, type(None)))}
        if run.waiting_reason:
            payload["waiting_reason"] = run.waiting_reason
        payload.update(event_payload or {})
        append_event(
            run,
            type="transition",
            actor=actor,
            reason=reason or name,
            payload=payload,
            from_status=from_status,
            to_status=run.status,
        )
        transaction.on_commit(lambda: publish_run_update(run.pk), robust=True)
        if run.is_terminal:
            wake_next_in_session(run.session_id)
    return run


def set_phase(run: Run, phase: str) -> None:
    """Record a new ``phase`` of a running run (no event: phases are detail)."""
    run.phase = phase
    if fenced(Run.objects.filter(pk=run.pk), run.pk).update(phase=phase, updated_at=timezone.now()) != 1:
        raise LeaseLost(f"run {run.pk}: lease lost; phase {phase!r} refused")
    transaction.on_commit(lambda: publish_run_update(run.pk), robust=True)


def append_message(run: Run, *, role: str, content: str = "", tool_calls=None, tool_call_id: str = "") -> Message:
    """Append one message to the session history of ``run`` (never edited later).

    Raises ``LeaseLost`` in a worker whose lease on the run was taken over.
    """
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


