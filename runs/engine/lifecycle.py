"""The run lifecycle: start a run (or add input to one), begin it, end it, cancel it.

API views, inbox views, admin actions, the loop and the sweeper call these;
``end_run`` is the one path by which any run ends (docs/design.md#ending-a-run).
"""

import functools
import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Min
from django.utils import timezone
from django.utils.translation import gettext as _

from approvals.services import cancel_pending_interrupts, pending_items_locked, request_reconciliation
from runs.engine.agents import version_for_new_work
from runs.base import selects
from runs.base.errors import Conflict, Forbidden, IdempotencyKeyReused, InvalidInput, SessionBusy
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
    Step,
    WaitingReason,
)
from runs.services import actor_for, announce_events, append_event, new_message, wake_next_in_session
from runs.transitions import apply
from runs.tx import locked, relock
from runs.wakeups import wake_on_commit
from tools.models import ToolCall, Wait, WaitStatus
from tools.services import deliver_tool_results, settle_calls_at_run_end, unknown_calls_for_a_person
from tools.waits import cancel_waits


class SubmitOutcome(StrEnum):
    """What ``submit_input`` did with an input (``Submitted.outcome``)."""

    CREATED = "created"  # a new run (the API's 201)
    SUPPLEMENTED = "supplemented"  # added to the busy run's conversation (the API's 200)


@dataclass(frozen=True)
class Submitted:
    """What ``submit_input`` did: ``outcome`` is ``CREATED`` (a new run) or ``SUPPLEMENTED`` (added to
    the busy ``run``); ``replayed`` is True when an ``Idempotency-Key`` named an earlier identical request."""

    run: Run
    outcome: SubmitOutcome
    replayed: bool = False


def _fingerprint(agent: Agent, session: Session | None, input: str, strategy: str, extra: dict) -> str:
    """What makes two requests with one idempotency key the same request (sha256 hex).

    The agent counts by slug: the same request sent again after a new version was made is still the same.
    ``extra`` holds the options a request set beyond the four (``start_at``, ``retry_of``).
    """
    parts = [agent.slug, session.pk if session else None, input, strategy] + ([extra] if extra else [])
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _replay(user, idempotency_key: str, fingerprint: str, agent: Agent, input: str) -> Submitted | None:
    """The earlier request made with ``idempotency_key``, if any; raises ``IdempotencyKeyReused`` if it differed."""
    earlier = RunEvent.objects.filter(run__requested_by=user, type__in=["transition", "input"],
                                      payload__idempotency_key=idempotency_key).select_related("run").first()
    if earlier is not None:
        if earlier.payload.get("request") != fingerprint:
            raise IdempotencyKeyReused(earlier.run_id)
        outcome = SubmitOutcome.SUPPLEMENTED if earlier.type == "input" else SubmitOutcome.CREATED
        return Submitted(earlier.run, outcome, replayed=True)
    run = Run.objects.filter(requested_by=user, idempotency_key=idempotency_key).select_related("agent").first()
    if run is None:
        return None
    if (run.agent.slug, run.input) != (agent.slug, input):  # a run keyed before requests were fingerprinted
        raise IdempotencyKeyReused(run.pk)
    return Submitted(run, SubmitOutcome.CREATED, replayed=True)


def submit_input(
    *,
    agent: Agent,
    user,
    input: str,
    session: Session | None = None,
    idempotency_key: str | None = None,
    multitask_strategy: str = MultitaskStrategy.ENQUEUE,
    start_at=None,
    retry_of: Run | None = None,
) -> Submitted:
    """Start a run for ``user``'s ``input`` (queued; a worker is woken), or add the input to one; say which.

    The run uses the current version of ``agent``'s slug (``version_for_new_work``), whichever
    version ``agent`` is; an archived agent is refused (``AgentArchived``, 409). A ``session``
    must be of the same slug, whichever version it was opened with.
    A new session is opened when ``session`` is None. When the session
    already has an active run, ``multitask_strategy`` decides (docs/design.md#multitask):
    ``enqueue`` (default: a new run that starts once the session is free),
    ``supplement`` (the input joins the busy run's conversation before its
    next model call and that run is returned; with no busy run it is
    enqueued), ``interrupt`` (the active runs are cancelled, then a new
    run), ``reject`` (``SessionBusy``, 409). With an ``idempotency_key``
    this user already sent, the earlier result is returned (``replayed``)
    if the request was the same, else ``IdempotencyKeyReused`` (422) is
    raised. ``start_at`` (an aware datetime, at most ``TOLLGATE["MAX_WAIT_S"]``
    ahead): the new run stays queued, waiting ``scheduled`` with ``wake_at``,
    until the sweeper wakes it then (a time already past starts it at
    once); not with ``supplement``. ``retry_of``: the run this one retries
    (``retry_run``). Raises ``InvalidInput`` for empty or oversized input, a
    session of another user or agent, an unknown strategy or a bad ``start_at``.
    """
    input = _checked_input(input, "input")
    if multitask_strategy not in MultitaskStrategy.values:
        raise InvalidInput.for_fields({"multitask_strategy": f"Must be one of: {', '.join(MultitaskStrategy.values)}."})
    extra = {**({"start_at": start_at.isoformat()} if start_at else {}), **({"retry_of": retry_of.pk} if retry_of else {})}
    start_at = _checked_start_at(start_at, multitask_strategy)
    fingerprint = _fingerprint(agent, session, input, multitask_strategy, extra)
    if idempotency_key and (earlier := _replay(user, idempotency_key, fingerprint, agent, input)):
        return earlier
    if session is not None and (session.owner_id != user.pk or session.agent.slug != agent.slug):
        raise InvalidInput.for_fields({"session": "That session belongs to another user or agent."})
    agent = version_for_new_work(agent)

    actor = actor_for(user)
    request = {"request": fingerprint, "idempotency_key": idempotency_key} if idempotency_key else {}
    try:
        with transaction.atomic():
            if session is None:
                session = Session.objects.create(owner=user, agent=agent, title=input[:200])
            else:
                Session.objects.select_for_update().get(pk=session.pk)  # one new input at a time per session
                if idempotency_key and (earlier := _replay(user, idempotency_key, fingerprint, agent, input)):
                    return earlier  # the same request, sent twice at once
                active = list(Run.objects.filter(session=session, status__in=ACTIVE_STATUSES).order_by("id"))
                busy = next((r for r in active if r.status in BUSY_STATUSES), None)
                if active and multitask_strategy == MultitaskStrategy.REJECT:
                    raise SessionBusy(busy or active[0])
                if busy and multitask_strategy == MultitaskStrategy.SUPPLEMENT:
                    # Under the run's lock (end_run takes it too): a run that is ending or
                    # asked to cancel gets no input it will never read; a new run takes it.
                    with locked(busy.pk) as tx:
                        if tx.run.status in BUSY_STATUSES and tx.run.cancel_requested_at is None:
                            tx.message(role="user", content=input)
                            tx.log(type="input", actor=actor, reason="supplemented",
                                   payload={"chars": len(input), **request})
                            return Submitted(tx.run, SubmitOutcome.SUPPLEMENTED)
                if multitask_strategy == MultitaskStrategy.INTERRUPT:
                    for other in active:
                        cancel_run(run=other, actor=actor, reason="interrupted by a new input")
            scheduled = {"waiting_reason": WaitingReason.SCHEDULED, "wake_at": start_at} if start_at else {}
            run = Run.objects.create(
                session=session, agent=agent, requested_by=user, input=input, idempotency_key=idempotency_key,
                retry_of=retry_of, **scheduled,
            )
            append_event(run, type="transition", actor=actor, reason="created", to_status=run.status,
                         payload={"multitask_strategy": multitask_strategy, **extra, **request})
            if not start_at:
                wake_on_commit(run.pk)  # a scheduled run is woken by the sweeper at start_at
    except IntegrityError:
        if idempotency_key and (earlier := _replay(user, idempotency_key, fingerprint, agent, input)):
            return earlier  # another request with this key won the race
        raise
    return Submitted(run, SubmitOutcome.CREATED)


def _checked_input(input: str | None, field_name: str) -> str:
    """``input`` stripped; ``InvalidInput`` (on ``field_name``) when it is empty or over ``MAX_INPUT_CHARS``."""
    input = (input or "").strip()
    limit = settings.TOLLGATE["MAX_INPUT_CHARS"]
    if not input:
        raise InvalidInput.for_fields({field_name: "Input must not be empty."})
    if len(input) > limit:
        raise InvalidInput.for_fields({field_name: f"Input is {len(input)} characters; the limit is {limit}."})
    return input


def start_runs(*, agent: Agent, user, inputs: list[str], start_at=None,
               admit: Callable[[int], None] | None = None) -> list[Run]:
    """Start one run per input of ``inputs``, each in a new session of its own, all at once; the runs, in order.

    What ``submit_input`` does for one input with no session, for many in
    one transaction: the same session, run and ``created`` event rows
    (queued, on the current version of ``agent``'s slug; a ``start_at``
    ahead: they wait ``scheduled``), written by one INSERT per kind of row
    on PostgreSQL (SQLite splits them by its parameter limit). The events
    are announced as ``append_events`` announces them (the webhook outbox,
    the runs' event sockets), and each run's wake-up is sent once the
    transaction commits, on its own, as a single start's is.

    All or nothing: raises ``InvalidInput`` (field ``inputs[i]``) for an
    empty or oversized input, no input at all or a bad ``start_at``, and
    ``AgentArchived`` (409) for an archived agent, and then starts none.
    ``admit(count)`` is called once those checks passed, before anything
    is written (the API counts the runs against its rate there); what it
    raises refuses the batch too.

    The idea is LangGraph Platform's run batch (``POST /runs/batch``):
    N runs started by one request.
    """
    if not inputs:
        raise InvalidInput.for_fields({"inputs": "Give at least one input."})
    texts = [_checked_input(text, f"inputs[{index}]") for index, text in enumerate(inputs)]
    payload = {"multitask_strategy": MultitaskStrategy.ENQUEUE,  # as submit_input logs it
               **({"start_at": start_at.isoformat()} if start_at else {})}
    start_at = _checked_start_at(start_at, MultitaskStrategy.ENQUEUE)
    agent = version_for_new_work(agent)
    if admit is not None:
        admit(len(texts))
    actor = actor_for(user)
    scheduled = {"waiting_reason": WaitingReason.SCHEDULED, "wake_at": start_at} if start_at else {}
    with transaction.atomic():
        sessions = Session.objects.bulk_create([Session(owner=user, agent=agent, title=text[:200]) for text in texts])
        runs = Run.objects.bulk_create([
            Run(session=session, agent=agent, requested_by=user, input=text, last_event_seq=1, **scheduled)
            for session, text in zip(sessions, texts)])
        announce_events(RunEvent.objects.bulk_create([
            RunEvent(run=run, seq=1, type="transition", actor=actor, reason="created", to_status=run.status,
                     payload=payload) for run in runs]))
        if not start_at:  # a scheduled run is woken by the sweeper at start_at
            for run in runs:
                wake_on_commit(run.pk)
    return runs


def _checked_start_at(start_at, strategy: str):
    """``start_at`` if it lies ahead (within ``MAX_WAIT_S``), None if absent or already past; else ``InvalidInput``."""
    if start_at is None:
        return None
    if timezone.is_naive(start_at):
        raise InvalidInput.for_fields({"start_at": "Give a date and time with a UTC offset."})
    if strategy == MultitaskStrategy.SUPPLEMENT:
        raise InvalidInput.for_fields({"start_at": "A supplement joins the busy run now; it cannot start later."})
    ahead = (start_at - timezone.now()).total_seconds()
    limit = settings.TOLLGATE["MAX_WAIT_S"]
    if ahead > limit:
        raise InvalidInput.for_fields({"start_at": f"At most {limit} seconds ahead."})
    return start_at if ahead > 0 else None


def retry_run(*, run: Run, user, idempotency_key: str | None = None) -> Submitted:
    """Start a new run that retries a failed or cancelled ``run``: same session, agent and input, ``retry_of`` set.

    Returns ``Submitted``; the retry runs on the agent's current version
    (docs/design.md#agent-versions) and is enqueued behind any active run
    of the session. Raises ``Forbidden`` unless ``user`` requested ``run``,
    ``AgentArchived`` (409) for an archived agent, ``Conflict`` for another
    status or when ``run`` already has a retry (``details["retry"]``)
    unless this is the same ``idempotency_key`` (then that retry answers).
    Decided under the run's row lock.
    """
    if run.requested_by_id != user.pk:
        raise Forbidden("Only the run's requester may retry it.")
    with locked(run.pk) as tx:  # one retry decided at a time
        run = tx.run
        if run.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
            raise Conflict(f"Only a failed or cancelled run can be retried; run {run.pk} is {run.status}.",
                           details={"status": run.status})
        earlier = run.retries.order_by("pk").first()
        if earlier is not None and not (idempotency_key and earlier.idempotency_key == idempotency_key):
            raise Conflict(f"Run {run.pk} was already retried by run {earlier.pk}; retry that run instead.",
                           details={"status": run.status, "retry": earlier.pk})
        return submit_input(agent=run.agent, user=user, input=run.input, session=run.session,
                            idempotency_key=idempotency_key, retry_of=run)


def start_run(**kwargs) -> Run:
    """``submit_input(**kwargs).run``: for callers that only need the run."""
    return submit_input(**kwargs).run


@dataclass(frozen=True)
class Begun:
    """A run ``begin_run`` started: ``message``, its input as stored in the session history; ``alone``, whether
    the session has no other run (then that message is the whole history, and no other call's id is taken)."""

    message: Message
    alone: bool


def begin_run(run: Run, *, actor: str) -> Begun | None:
    """A worker starts a queued run if its session is free: ``queued -> running``, input into the history.

    Runs of a session start one at a time, oldest first; returns None
    (the run stays queued) while an older run of the session is active,
    or when another run of the session became busy first. Two statements
    on PostgreSQL: the session's other runs looked at, then the transition
    with the input message in its event's statement (elsewhere the message
    is inserted after the event). Raises what ``runs.transitions.apply``
    raises (``LeaseLost`` under a lease taken over, ``TransitionNotAllowed``,
    ``ConcurrentTransition``).
    """
    older_active, others = _session_others(run)
    if older_active:
        return None  # an older run of the session is active
    stored: list[Message] = []

    def the_input(_run) -> list[Message]:
        stored[:] = [new_message(run, role="user", content=run.input)]
        return stored

    try:
        with transaction.atomic():
            apply(run.start, actor=actor, reason="picked up by worker", savepoint=False, inserts=the_input)
    except IntegrityError:  # another run of the session became busy first
        return None
    return Begun(message=stored[0], alone=not others)


def _session_others(run: Run) -> tuple[bool, bool]:
    """``(an older run of run's session is active, the session has any run but this one)``, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(_session_others_sql(), [run.session_id, run.pk, *ACTIVE_STATUSES, run.session_id, run.pk])
        older_active, others = cursor.fetchone()
    return bool(older_active), bool(others)


@functools.cache
def _session_others_sql() -> str:
    """``_session_others``' statement; its parameters: session id, run id, ``ACTIVE_STATUSES``, session id, run id."""
    quote, meta = connection.ops.quote_name, Run._meta
    table, pk, session, status = (quote(name) for name in (
        meta.db_table, meta.pk.column, meta.get_field("session").column, meta.get_field("status").column))
    statuses = ", ".join(["%s"] * len(ACTIVE_STATUSES))
    return (f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {session} = %s AND {pk} < %s AND {status} IN ({statuses})), "
            f"EXISTS (SELECT 1 FROM {table} WHERE {session} = %s AND {pk} <> %s)")


@dataclass
class EndingReads:
    """What ``end_run`` reads of a run, loaded for many runs at once (``load_endings``); a caller changes them to tell of a change.

    ``items``: pending inbox items, locked, newest first; ``waits``: pending; ``calls``: by id; ``tool_messages``;
    ``read_upto``: the last finished model call's ``last_message_id`` (0: none, None: not tracked); ``inputs``: user
    message ids, ascending; ``next_queued``: the session's oldest queued run id or None.
    """

    items: list = field(default_factory=list)
    waits: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    tool_messages: list = field(default_factory=list)
    read_upto: int | None = 0
    inputs: list[int] = field(default_factory=list)
    next_queued: int | None = None


def load_endings(runs: list[Run]) -> dict[int, EndingReads]:
    """``{run id: EndingReads}`` for ``runs``, with one query per kind of row whatever their number (7).

    Call inside a transaction holding the runs' row locks (the pending
    items are locked here, after them). For callers that end many runs at
    once (the sweeper); the runs' calls are attached to their run objects.
    """
    by_id = {run.pk: run for run in runs}
    reads = {run_id: EndingReads() for run_id in by_id}
    for item in pending_items_locked(list(by_id)):
        reads[item.run_id].items.append(item)
    for wait in Wait.objects.filter(run_id__in=by_id, status=WaitStatus.PENDING).order_by("id"):
        reads[wait.run_id].waits.append(wait)
    for call in ToolCall.objects.filter(run_id__in=by_id).order_by("id"):
        call.run = by_id[call.run_id]
        reads[call.run_id].calls.append(call)
    for message in Message.objects.filter(run_id__in=by_id, role="tool").only("run_id", "role", "tool_call_id"):
        reads[message.run_id].tool_messages.append(message)
    steps = Step.objects.filter(run_id__in=by_id, status__in=[Step.Status.SUCCEEDED, Step.Status.FAILED])
    seen = set()
    for run_id, read_upto in steps.order_by("run_id", "-index").values_list("run_id", "request__last_message_id"):
        if run_id not in seen:
            seen.add(run_id)
            reads[run_id].read_upto = read_upto
    for run_id, message_id in Message.objects.filter(run_id__in=by_id, role="user").order_by("id").values_list(
            "run_id", "id"):
        reads[run_id].inputs.append(message_id)
    sessions = {run.session_id for run in runs}
    first_queued = dict(Run.objects.filter(session_id__in=sessions, status=RunStatus.QUEUED).order_by()
                        .values("session_id").annotate(first=Min("id")).values_list("session_id", "first"))
    for run in runs:
        reads[run.pk].next_queued = first_queued.get(run.session_id)
    return reads


def ending_reads(run: Run, *, calls: list, history: list, read_upto: int | None) -> EndingReads:
    """``EndingReads`` of one run whose caller holds its row lock and knows the rest as it is stored.

    ``calls``: the run's tool calls in id order; ``history``: its session's
    messages in id order; ``read_upto``: the ``last_message_id`` of its last
    finished model call. Valid only when no other writer changed the run
    since the caller read them (the run's event counter shows it: every
    such writer logs an event). Three queries: the pending items (locked),
    the pending waits and the session's oldest queued run.
    """
    following = selects.first_value(Run, {"session": run.session_id, "status": RunStatus.QUEUED}, "pk", order_by="pk")
    return EndingReads(
        items=pending_items_locked([run.pk]),
        waits=selects.select(Wait, {"run": run.pk, "status": WaitStatus.PENDING}, order_by="id"),
        calls=calls,
        tool_messages=[message for message in history if message.run_id == run.pk and message.role == "tool"],
        read_upto=read_upto,
        inputs=[message.pk for message in history if message.run_id == run.pk and message.role == "user"],
        next_queued=following,
    )


def end_run(ending, *, actor: str, reason: str, reads: EndingReads | None = None, **kwargs) -> Run:
    """End a run with ``ending``, its bound ``complete``, ``fail`` or ``cancel`` transition: the one ending path.

    In one transaction: cancels pending approval and input items and waits,
    settles the calls in flight, delivers finished results, applies
    ``ending`` (its event lists the ``effects``), hands on unread input and
    wakes the session's next queued run (docs/design.md#ending-a-run).
    ``kwargs`` go to the transition (``outcome``/``outcome_reason``/
    ``final_output``, or ``failure_type``/``error``). Returns the run.
    Raises ``TransitionNotAllowed`` for a terminal run, or a ``complete``
    after a cancel was requested. ``reads``: from ``load_endings`` or
    ``ending_reads``, by a caller holding the run's row lock whose
    transaction any error aborts whole; then nothing is locked or read
    again, and no savepoint is taken.
    """
    run = ending.__self__
    with transaction.atomic(savepoint=reads is None):
        if reads is None:
            relock(run)  # serialises with submit_input
        cancel_pending_interrupts(run=run, actor=actor, pending=reads.items if reads else None)
        cancel_waits(run, actor=actor, pending=reads.waits if reads else None)
        calls = reads.calls if reads else list(run.tool_calls.order_by("id"))
        effects = settle_calls_at_run_end(run=run, calls=calls, actor=actor)
        for call in unknown_calls_for_a_person(calls):
            request_reconciliation(tool_call=call)
        deliver_tool_results(run, calls=calls, history=reads.tool_messages if reads else None, fence=False)
        unread = _unread_supplements(run, reads)
        apply(ending, actor=actor, reason=reason, payload={"effects": effects}, savepoint=reads is None, **kwargs)
        if reads is None:
            wake_next_in_session(run.session_id)
        elif reads.next_queued is not None:
            wake_on_commit(reads.next_queued)
        if unread:
            _hand_on_unread_input(run, unread, actor=actor, start_next=ending.__func__ is Run.complete)
        return run


def _unread_supplements(run: Run, reads: EndingReads | None = None) -> list[Message]:
    """User messages supplemented into ``run`` after its last model call read the history (``reads``: as loaded)."""
    if reads is not None:
        if reads.read_upto is None:
            return []
        unread = [message_id for message_id in reads.inputs[1:] if message_id > reads.read_upto]
        return list(Message.objects.filter(pk__in=unread).order_by("id")) if unread else []
    last_step = run.steps.filter(status__in=["succeeded", "failed"]).order_by("-index").first()
    read_upto = last_step.request.get("last_message_id") if last_step else 0
    if read_upto is None:  # a step recorded before reads were tracked
        return []
    inputs = run.messages.filter(role="user")
    first_input = inputs.order_by("id").values("id")[:1]
    return list(inputs.filter(id__gt=read_upto).exclude(id__in=first_input).order_by("id"))


def _hand_on_unread_input(run: Run, unread: list[Message], *, actor: str, start_next: bool) -> None:
    """Accepted input the ended run never read: queue it as the session's next run, or say it was not read.

    The next run keeps the ended run's agent version: the input was accepted for that run, so
    neither a newer version nor an archiving since turns it away.
    """
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
    wake_on_commit(following.pk)


def cancel_run(*, run: Run, actor: str, reason: str = "cancel requested") -> Run:
    """Ask for ``run`` to be cancelled: queued or waiting runs stop at once, running ones at the next safe point.

    Effects that already happened stay (they are listed in the events).
    A cancelled run is returned as it is (a repeated cancel changes nothing);
    raises ``TransitionNotAllowed`` for a completed or failed one.
    """
    with locked(run.pk) as tx:
        run = tx.run
        if run.status == RunStatus.CANCELLED:
            return run
        if run.is_terminal:
            run.cancel()  # raises TransitionNotAllowed
        if run.status == RunStatus.RUNNING:  # the worker's next safe point reads the column
            if run.cancel_requested_at is None:
                tx.set(cancel_requested_at=timezone.now())
            tx.log(type="cancel_requested", actor=actor, reason=reason)
            return run
        if run.cancel_requested_at is None:
            run.cancel_requested_at = timezone.now()
            Run.objects.filter(pk=run.pk).update(cancel_requested_at=run.cancel_requested_at)
        return end_run(run.cancel, actor=actor, reason=reason)


def cancel_run_as(*, run: Run, user, reason: str = "cancel requested") -> Run:
    """``cancel_run`` on behalf of ``user``, who must be allowed to (``Run.objects.cancellable_by``).

    What the API, the run page and the admin call. Raises ``Forbidden``
    when ``user`` may not cancel ``run``, and what ``cancel_run`` raises.
    """
    if not Run.objects.cancellable_by(user).filter(pk=run.pk).exists():
        raise Forbidden(_("You may not cancel this run."))
    return cancel_run(run=run, actor=actor_for(user), reason=reason)
