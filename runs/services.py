"""Every write to a run goes through here: start, transitions, events, cancel.

Callers: API views, inbox views, admin actions, the worker loop and the
approvals services. Each public function runs in (or joins) a database
transaction; work that must only happen after commit (waking a worker,
pushing to browsers) is deferred with ``transaction.on_commit``.
"""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from runs import lease
from runs.lease import LeaseLost, fenced
from runs.models import (
    ACTIVE_STATUSES,
    BUSY_STATUSES,
    Agent,
    Message,
    MultitaskStrategy,
    Run,
    RunEvent,
    RunStatus,
    Session,
)


# Fields a transition may change; saving only these never overwrites a
# concurrent writer's other fields (e.g. cancel_requested_at).
TRANSITION_FIELDS = [
    "status", "phase", "waiting_reason", "wake_at", "failure_type", "outcome", "outcome_reason",
    "error", "final_output", "started_at", "finished_at", "updated_at",
]


class SessionBusy(Exception):
    """The session already has an active run (HTTP 409)."""

    def __init__(self, active_run: Run):
        super().__init__(f"Session {active_run.session_id} already has an active run ({active_run.pk}).")
        self.active_run = active_run


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
    from runs.live import publish_run_update

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
    from runs.live import publish_run_update

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


def enqueue_advance(run_id: int) -> None:
    """Wake a worker for ``run_id`` once the current transaction commits."""
    from runs.actors import advance_run

    # robust: a broker that is down must not fail the request; the sweeper
    # re-enqueues runs whose wake-up was lost.
    transaction.on_commit(lambda: advance_run.send(run_id), robust=True)


def start_run(
    *,
    agent: Agent,
    user,
    input: str,
    session: Session | None = None,
    idempotency_key: str | None = None,
    multitask_strategy: str = MultitaskStrategy.ENQUEUE,
) -> Run:
    """Start a run for ``user``'s ``input`` (queued; a worker is woken), or add the input to one.

    A new session is opened when ``session`` is None. When the session
    already has an active run, ``multitask_strategy`` decides (docs/design.md#multitask):
    ``enqueue`` (default: a new run that starts once the session is free),
    ``supplement`` (the input joins the busy run's conversation before its
    next model call and that run is returned; with no busy run it is
    enqueued), ``interrupt`` (the active runs
    are cancelled, then a new run), ``reject`` (``SessionBusy``, 409).
    With an ``idempotency_key`` already used by this user, the earlier run
    is returned. Raises ``ValidationError`` for empty or oversized input, a
    session of another user or agent, or an unknown strategy.
    """
    input = (input or "").strip()
    limit = settings.TOLLGATE["MAX_INPUT_CHARS"]
    if not input:
        raise ValidationError({"input": "Input must not be empty."})
    if len(input) > limit:
        raise ValidationError({"input": f"Input is {len(input)} characters; the limit is {limit}."})
    if multitask_strategy not in MultitaskStrategy.values:
        raise ValidationError({"multitask_strategy": f"Must be one of: {', '.join(MultitaskStrategy.values)}."})
    if idempotency_key:
        earlier = Run.objects.filter(requested_by=user, idempotency_key=idempotency_key).first()
        if earlier:
            return earlier
    if session is not None and (session.owner_id != user.pk or session.agent_id != agent.pk):
        raise ValidationError({"session": "That session belongs to another user or agent."})

    actor = actor_for(user)
    try:
        with transaction.atomic():
            if session is None:
                session = Session.objects.create(owner=user, agent=agent, title=input[:200])
            else:
                Session.objects.select_for_update().get(pk=session.pk)  # one new input at a time per session
                active = list(Run.objects.filter(session=session, status__in=ACTIVE_STATUSES).order_by("id"))
                busy = next((r for r in active if r.status in BUSY_STATUSES), None)
                if active and multitask_strategy == MultitaskStrategy.REJECT:
                    raise SessionBusy(busy or active[0])
                if busy and multitask_strategy == MultitaskStrategy.SUPPLEMENT:
                    append_message(busy, role="user", content=input)
                    append_event(busy, type="input", actor=actor, reason="supplemented", payload={"chars": len(input)})
                    return busy
                if multitask_strategy == MultitaskStrategy.INTERRUPT:
                    for other in active:
                        cancel_run(run=other, actor=actor, reason="interrupted by a new input")
            run = Run.objects.create(
                session=session, agent=agent, requested_by=user, input=input, idempotency_key=idempotency_key
            )
            append_event(run, type="transition", actor=actor, reason="created", to_status=run.status,
                         payload={"multitask_strategy": multitask_strategy})
            enqueue_advance(run.pk)
    except IntegrityError:
        if idempotency_key:
            return Run.objects.get(requested_by=user, idempotency_key=idempotency_key)
        raise
    return run


def begin_run(run: Run, *, actor: str) -> bool:
    """A worker starts a queued run if its session is free: ``queued -> running``, input into the history.

    Runs of a session start one at a time, oldest first; returns False
    (the run stays queued) while an older run of the session is active.
    """
    older_active = Run.objects.filter(session_id=run.session_id, status__in=ACTIVE_STATUSES, pk__lt=run.pk)
    if older_active.exists():
        return False
    try:
        with transaction.atomic():
            transition_run(run, "start", actor=actor, reason="picked up by worker")
            append_message(run, role="user", content=run.input)
    except IntegrityError:  # another run of the session became busy first
        return False
    return True


def wake_next_in_session(session_id: int) -> None:
    """Wake a worker for the oldest queued run of the session (called when a run ends)."""
    following = Run.objects.filter(session_id=session_id, status=RunStatus.QUEUED).order_by("id").first()
    if following is not None:
        enqueue_advance(following.pk)


def end_run(run: Run, name: str, *, actor: str, reason: str, **kwargs) -> Run:
    """End ``run`` with the transition ``name`` (``complete``, ``fail`` or ``cancel``): the one ending path.

    In one transaction, before the transition:

    1. pending approval and input items are cancelled (reconciliation
       items stay: an effect whose outcome is unknown is settled whatever
       becomes of the run);
    2. no call is left in flight (``tools.services.settle_calls_at_run_end``):
       calls never sent are cancelled, calls that were sent and not
       finished become ``unknown``; an unknown call whose tool has a
       reconcile hook keeps being looked up by the sweeper, one without
       gets a person's reconciliation item;
    3. every finished call's result is delivered into the history, so a
       later run of the session reads what happened;
    4. input supplemented after the last model call (never read): on
       ``complete`` it becomes the session's next queued run, otherwise the
       event log says it was not read.

    The terminal event's payload lists the run's ``effects`` (side-effecting
    calls that succeeded or whose outcome is unknown). ``kwargs`` go to the
    transition (``outcome``/``outcome_reason``/``final_output``, or
    ``failure_type``/``error``). Raises ``TransitionNotAllowed`` for a
    terminal run.
    """
    from approvals.services import cancel_pending_interrupts, request_reconciliation
    from tools.services import deliver_tool_results, settle_calls_at_run_end, unknown_calls_for_a_person

    with transaction.atomic():
        cancel_pending_interrupts(run=run, actor=actor)
        effects = settle_calls_at_run_end(run=run, actor=actor)
        for call in unknown_calls_for_a_person(run):
            request_reconciliation(tool_call=call)
        deliver_tool_results(run)
        unread = _unread_supplements(run)
        transition_run(run, name, actor=actor, reason=reason, event_payload={"effects": effects}, **kwargs)
        if unread:
            _hand_on_unread_input(run, unread, actor=actor, start_next=name == "complete")
        return run


def _unread_supplements(run: Run) -> list[Message]:
    """User messages supplemented into ``run`` after its last model call read the history."""
    last_step = run.steps.filter(status__in=["succeeded", "failed"]).order_by("-index").first()
    read_upto = last_step.request.get("last_message_id") if last_step else 0
    if read_upto is None:  # a step recorded before reads were tracked
        return []
    first_input = run.messages.filter(role="user").order_by("id").values_list("id", flat=True).first()
    return list(run.messages.filter(role="user", id__gt=read_upto).exclude(id=first_input).order_by("id"))


def _hand_on_unread_input(run: Run, unread: list[Message], *, actor: str, start_next: bool) -> None:
    """Accepted input the ended run never read: queue it as the session's next run, or say it was not read."""
    text = "\n\n".join(message.content for message in unread)
    ids = [message.pk for message in unread]
    if not start_next:
        append_event(run, type="input", actor=actor, reason="supplemented input was not read before the run ended",
                     payload={"messages": ids})
        return
    following = Run.objects.create(session_id=run.session_id, agent_id=run.agent_id,
                                   requested_by_id=run.requested_by_id, input=text)
    append_event(following, type="transition", actor=actor, reason="created", to_status=following.status,
                 payload={"unread_input_of_run": run.pk, "messages": ids})
    append_event(run, type="input", actor=actor, reason=f"supplemented input was not read; queued as run {following.pk}",
                 payload={"messages": ids, "run": following.pk})
    enqueue_advance(following.pk)


def cancel_run(*, run: Run, actor: str, reason: str = "cancel requested") -> Run:
    """Ask for ``run`` to be cancelled: queued or waiting runs stop at once, running ones at the next safe point.

    Effects that already happened stay (they are listed in the events).
    Raises ``TransitionNotAllowed`` for a terminal run.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.is_terminal:
            run.cancel()  # raises TransitionNotAllowed
        if run.cancel_requested_at is None:
            run.cancel_requested_at = timezone.now()
            Run.objects.filter(pk=run.pk).update(cancel_requested_at=run.cancel_requested_at)
        if run.status == RunStatus.RUNNING:
            append_event(run, type="cancel_requested", actor=actor, reason=reason)
            return run
        return end_run(run, "cancel", actor=actor, reason=reason)
