"""Human decisions: open inbox items, resolve them, resume the run.

Only a user the item is decidable by (``Interrupt.objects.decidable_by``,
``runs.access``) resolves it, through ``decide_interrupt`` or
``reconcile_interrupt``; the web inbox, the REST API and the admin all call
them. The permission is checked before anything about the item is said.
Text in a model's output never reaches this module.
"""

from datetime import timedelta

from django.conf import settings
from django.core.files.base import ContentFile
from django.utils import timezone, translation
from django.utils.translation import gettext as _
from django_fsm import can_proceed

from approvals import answer_files, notifications
from approvals.models import AnswerFile, Decision, Interrupt, InterruptKind, InterruptStatus, item_title
from runs.access import may_decide
from runs.base import selects
from runs.base.errors import Expired, Forbidden, InvalidInput
from runs.models import WaitingReason
from runs.services import actor_for, append_event
from runs.base.tracing import record_decision
from runs.transitions import apply
from runs.tx import RunTx, locked
from tools.models import ToolCall, Wait, WaitStatus
from tools.registry import Tool, get_tool
from tools.services import (
    approve_tool_call, check_edited_arguments, expire_tool_call, reject_tool_call, settle_unknown_call,
)
from tools.services.edits import argument_changes
from tools.services.summary import target_of
from tools.waits import settle_wait


def _log_opened(interrupt: Interrupt, *, reason: str) -> None:
    """The event of a new item (its later changes are transitions, logged by ``runs.transitions.apply``),
    and its email to the people it is for, once the transaction commits (``approvals.notifications``)."""
    append_event(interrupt.run, type=interrupt.event_type, actor="worker", reason=reason,
                 payload=interrupt.event_payload({}), to_status=interrupt.status)
    notifications.new_item_on_commit(interrupt)


def request_approval(*, tool_call, tool, rule: str = "") -> Interrupt:
    """Open a pending approval item for ``tool_call`` (a ``tools.registry.Tool``).

    ``rule`` is the approval rule that fired (``Assessment.rule``), kept on
    the item for the inbox; the item's ``target`` groups it with other
    pending calls on the same thing (``tools.services.summary.target_of``).

    It expires after ``TOLLGATE["APPROVAL_TTL_HOURS"]``. The run is moved
    to ``waiting/approval`` by the loop, once every call of the turn has
    been proposed. The run's requester may decide it only if the tool
    allows (``Tool.requester_may_decide``); a side-effecting tool's opt-out
    of four eyes is named in the event.
    """
    interrupt = Interrupt(
        run=tool_call.run,
        tool_call=tool_call,
        kind=InterruptKind.APPROVAL,
        title=_stored_title(InterruptKind.APPROVAL, tool_call),
        required_permission=tool.permission,
        allow_requester=tool.requester_may_decide,
        expires_at=timezone.now() + timedelta(hours=settings.TOLLGATE["APPROVAL_TTL_HOURS"]),
        rule=rule,
        target=target_of(tool, tool_call.arguments),
    )
    interrupt.insert_row()  # as save() stores it, in one statement
    _log_opened(interrupt, reason=_requested("approval", tool))
    return interrupt


def _stored_title(kind: str, tool_call) -> str:
    """The title kept on a new item: ``item_title`` in English (the API's language; pages build their own)."""
    with translation.override("en"):
        return item_title(kind, tool_call, stored=tool_call.name)


def _requested(kind: str, tool) -> str:
    """The event reason of a new item; says so when a side-effecting tool waives four eyes."""
    if tool.side_effect and tool.requester_may_decide:
        return f"{kind} requested (the tool lets the requester decide: no four eyes)"
    return f"{kind} requested"


def request_reconciliation(*, tool_call) -> Interrupt:
    """Open a pending reconciliation item for an ``unknown`` call (no hook could settle it).

    Returns the existing pending item if there is one. It does not expire:
    only a person who checked the external system can settle it. A call of
    a tool no longer registered gets the default permission and four eyes.
    """
    existing = tool_call.interrupts.filter(kind=InterruptKind.RECONCILIATION, status=InterruptStatus.PENDING).first()
    if existing:
        return existing
    tool = get_tool(tool_call.name) or Tool(name=tool_call.name, description="", parameters={"type": "object"},
                                            handler=None, side_effect=tool_call.side_effect)
    interrupt = Interrupt(
        run=tool_call.run,
        tool_call=tool_call,
        kind=InterruptKind.RECONCILIATION,
        title=_stored_title(InterruptKind.RECONCILIATION, tool_call),
        required_permission=tool.permission,
        allow_requester=tool.requester_may_decide,
        target=target_of(tool, tool_call.arguments),
    )
    interrupt.insert_row()
    _log_opened(interrupt, reason=_requested("reconciliation", tool))
    return interrupt


def close_reconciliation_items(*, tool_call, actor: str, reason: str) -> int:
    """Cancel the pending reconciliation items of ``tool_call`` (its outcome was settled another way); returns how many."""
    closed = 0
    for interrupt in tool_call.interrupts.select_for_update().filter(kind=InterruptKind.RECONCILIATION,
                                                                   status=InterruptStatus.PENDING):
        apply(interrupt.cancel, actor=actor, reason=reason, now=timezone.now())
        closed += 1
    return closed


def reconcile_interrupt(*, interrupt: Interrupt, user, succeeded: bool, evidence: str, result=None) -> Interrupt:
    """A person settles an unknown outcome: the call ``succeeded`` (with ``result``) or failed.

    ``evidence`` (required) says what the person checked. The run resumes
    from the same point. Raises ``Forbidden`` (checked first), ``TransitionNotAllowed``
    (item not pending) and ``InvalidInput`` (no evidence, wrong kind).
    """
    if not can_decide(user, interrupt):
        raise Forbidden("You may not reconcile this item.")
    if interrupt.kind != InterruptKind.RECONCILIATION:
        raise InvalidInput("Only reconciliation items can be reconciled.")
    if not (evidence or "").strip():
        raise InvalidInput.for_fields({"evidence": "Say what you checked: evidence is required."})
    actor = actor_for(user)
    decision = Decision.SUCCEEDED if succeeded else Decision.FAILED
    with locked(interrupt.run_id) as tx:
        interrupt = _lock_item(tx, interrupt.pk, decider=user, others_pending=True)
        resumes = _unblocks(tx, interrupt)
        apply(interrupt.resolve, actor=actor, reason=f"reconciled: {decision}", decision=decision, user=user,
              comment=evidence, edited_arguments=None, now=timezone.now())
        settle_unknown_call(tool_call=interrupt.tool_call, succeeded=succeeded, result=result,
                            evidence=evidence, actor=actor)
        if resumes:
            apply(tx.run.resume, actor=actor, reason="resumed after decision")
    return interrupt


def overdue_interrupts(*, now, limit: int | None = None) -> list[tuple[int, int]]:
    """``(item id, run id)`` of pending approval items past ``expires_at`` (for the sweeper), longest overdue first, at most ``limit``.

    Input items are left out: their wait ends them (``expire_input_item``) and the run goes on (docs/design.md#scale-of-the-waiting-set).
    """
    overdue = Interrupt.objects.filter(status=InterruptStatus.PENDING, expires_at__lte=now).exclude(
        kind=InterruptKind.INPUT).order_by("expires_at")
    return list(overdue.values_list("pk", "run_id")[:limit])


def expire_interrupt(tx: RunTx, *, interrupt_id: int, now, actor: str) -> Interrupt | None:
    """Expire one overdue pending item of ``tx.run`` and its tool call (``awaiting_approval -> expired``).

    Returns the item, or None if it was no longer pending. Ending the run
    is the caller's (the engine's sweeper fails it with ``approval_expired``).
    """
    return expire_locked_interrupt(_lock_item(tx, interrupt_id), now=now, actor=actor)


def expire_locked_interrupt(interrupt: Interrupt, *, now, actor: str) -> Interrupt | None:
    """``expire_interrupt`` for an item the caller has locked (after its run) and loaded with its tool call.

    For a sweeper that loads many items at once; returns the item, or None
    if it was no longer pending. The writes take no savepoint: an error
    aborts the caller's whole transaction (as the sweeper wants).
    """
    if not can_proceed(interrupt.expire):
        return None
    apply(interrupt.expire, actor=actor, reason="expired", now=now, savepoint=False)
    if interrupt.tool_call is not None and interrupt.kind == InterruptKind.APPROVAL:
        expire_tool_call(tool_call=interrupt.tool_call, actor=actor)
    return interrupt


def can_decide(user, interrupt: Interrupt) -> bool:
    """Whether ``user`` may resolve ``interrupt``: ``Interrupt.objects.decidable_by``, the one rule (docs/design.md#who-may-see-and-decide).

    One query, or none when ``interrupt`` was loaded ``with_decidable_flag(user)`` for this user (or
    flagged for them by ``runs.access.flag_decidable``).
    """
    if user.pk is not None and getattr(interrupt, "decidable_flag_for", None) == user.pk:
        return bool(interrupt.user_may_decide)
    return Interrupt.objects.decidable_by(user).filter(pk=interrupt.pk).exists()


def request_input(*, tool_call, title: str, expires_at) -> Interrupt:
    """Open a pending input item: the question of ``tool_call`` (``ask_user``) to the run's requester.

    It expires at ``expires_at`` (the wait's deadline). The engine puts the
    run to wait ``input`` in the same transaction.
    """
    interrupt = Interrupt(
        run=tool_call.run, tool_call=tool_call, kind=InterruptKind.INPUT, title=title,
        allow_requester=True, expires_at=expires_at,
    )
    interrupt.insert_row()
    _log_opened(interrupt, reason="input requested")
    return interrupt


def question_options(interrupt: Interrupt) -> list[str]:
    """The choices an input item offers (its ``ask_user`` call's ``options``); empty: free text."""
    arguments = interrupt.tool_call.arguments if interrupt.tool_call is not None else None
    return list((arguments or {}).get("options") or [])


MAX_ANSWER_CHARS = 10_000


def answer_interrupt(*, interrupt: Interrupt, user, answer: str, file=None) -> Interrupt:
    """Answer an input item: the answer (and file) becomes its tool call's result and the run resumes.

    ``answer`` must be at most ``MAX_ANSWER_CHARS`` characters and, when
    the question has options, exactly one of them; it may be empty only
    when a ``file`` (a Django ``UploadedFile``) comes with it. A file must
    be allowed by the question (``approvals.answer_files``: ``file``
    ``optional`` or ``required``, type and size); it is stored through
    Django's storage API as an ``AnswerFile`` and the result holds its
    metadata (``"file"``, see ``answer_files.summary``). The item is
    ``resolved`` with decision ``answered`` (``comment`` holds the answer).
    Raises ``Forbidden`` (not the requester or staff; checked first),
    ``InvalidInput`` (wrong kind, bad answer, a file missing, not allowed
    or of a refused type), ``TooLarge`` (a file over the size limit) and
    ``TransitionNotAllowed`` (no longer pending); nothing is stored then.
    """
    if not can_decide(user, interrupt):
        raise Forbidden("You may not answer this item.")
    if interrupt.kind != InterruptKind.INPUT:
        raise InvalidInput(f"A {interrupt.kind} item is not answered.")
    answer = (answer or "").strip()
    options = question_options(interrupt)
    rule = answer_files.file_rule(interrupt.tool_call.arguments if interrupt.tool_call else None)
    checked = answer_files.check(file, rule) if file is not None else None
    if not answer and checked is None:
        raise InvalidInput.for_fields({"answer": "The answer must not be empty."})
    if len(answer) > MAX_ANSWER_CHARS:
        raise InvalidInput.for_fields({"answer": f"The answer is over {MAX_ANSWER_CHARS} characters."})
    if options and answer not in options:
        raise InvalidInput.for_fields({"answer": f"Choose one of: {', '.join(options)}."})
    if rule.mode == "required" and checked is None:
        raise InvalidInput.for_fields({"file": "This question needs a file."})
    actor = actor_for(user)
    result = {"answer": answer, "answered_by": user.get_username()}
    stored = None
    try:
        with locked(interrupt.run_id) as tx:
            interrupt = _lock_item(tx, interrupt.pk, decider=user)
            apply(interrupt.resolve, actor=actor, reason=Decision.ANSWERED, decision=Decision.ANSWERED, user=user,
                  comment=answer, edited_arguments=None, now=timezone.now())
            if checked is not None:
                stored = AnswerFile(interrupt=interrupt, name=checked.name, content_type=checked.content_type,
                                    size=checked.size, sha256=checked.sha256, uploaded_by=user)
                stored.file.save(checked.name, ContentFile(checked.content), save=True)
                result["file"] = answer_files.summary(stored, checked.content)
            wait = Wait.objects.get(tool_call_id=interrupt.tool_call_id)
            settle_wait(wait, status=WaitStatus.DONE, actor=actor, result=result)
    except BaseException:
        if stored is not None and stored.file.name:  # the row rolled back; the stored bytes go too
            stored.file.storage.delete(stored.file.name)
        raise
    return interrupt


def expire_input_item(tx: RunTx, *, tool_call, now, actor: str) -> Interrupt | None:
    """Expire the pending input item of ``tool_call``, a call of ``tx.run`` (its wait timed out); None if
    there is none."""
    interrupt = tool_call.interrupts.filter(kind=InterruptKind.INPUT, status=InterruptStatus.PENDING).first()
    if interrupt is None:
        return None
    return expire_interrupt(tx, interrupt_id=interrupt.pk, now=now, actor=actor)


def _lock_item(tx: RunTx, interrupt_id: int, *, decider=None, others_pending: bool = False) -> Interrupt:
    """Item ``interrupt_id`` of ``tx.run`` locked (``SELECT ... FOR UPDATE`` of its row only, after the
    run's: ``runs.tx``'s lock order) with its tool call and answer file loaded (the answer shows both);
    ``tx.run`` is attached to both, so events and transitions on them do not read the run again.

    With ``decider`` (a user), ``Forbidden`` unless they may decide it now: the caller's check trusted a
    flag loaded before the lock (``can_decide``), perhaps for another instance of the user, so a decider
    whom the item or its run no longer lets decide (its kind, the permission it asks, the run's requester,
    all read locked) decides nothing. The rule is checked in memory on the locked row and run
    (``runs.access.may_decide``), with the permissions and ``is_active`` of this user object (read once
    per object, at the request's start: a right taken away during the request counts from the next one):
    no statement of its own. With ``others_pending``, the same statement sets ``others_pending``:
    whether another item of the run is pending (``_unblocks``). Raises ``Interrupt.DoesNotExist``."""
    flags = ({"others_pending": (Interrupt, selects.Sharing("run"), {"status": InterruptStatus.PENDING})}
             if others_pending else None)
    interrupt = selects.select_one(Interrupt, {"pk": interrupt_id}, related=("tool_call", "answer_file"),
                                   flags=flags, for_update=True)
    if tx.run.pk == interrupt.run_id:
        interrupt.run = tx.run
        if interrupt.tool_call is not None:
            interrupt.tool_call.run = tx.run
    if decider is not None and not may_decide(decider, interrupt, requested_by_id=interrupt.run.requested_by_id):
        raise Forbidden(_("You may not decide this item."))
    return interrupt


def decide_interrupt(
    *, interrupt: Interrupt, user, decision: str, comment: str = "", edited_arguments: dict | None = None
) -> Interrupt:
    """Resolve an approval item: ``decision`` is ``approved`` or ``rejected``.

    The tool call becomes ``ready`` (with ``edited_arguments`` if given)
    or ``rejected``; once no item of the run is pending, the run resumes
    and a worker is woken. An approval with edited arguments logs what
    changed in its event (``changes``, ``tools.services.edits``). Raises
    ``Forbidden`` (403, checked first), ``TransitionNotAllowed`` when the
    item is no longer pending (409), ``Expired`` (409) when it is past its
    ``expires_at`` (still pending until the sweeper expires it and fails
    the run, as for an item nobody decided) and ``InvalidInput`` for
    edited arguments that break the tool's schema.
    """
    if not can_decide(user, interrupt):
        raise Forbidden(_("You may not decide this item."))
    if decision not in (Decision.APPROVED, Decision.REJECTED):
        raise InvalidInput(f"Unknown decision {decision!r}.")
    if interrupt.kind != InterruptKind.APPROVAL:
        raise InvalidInput(f"A {interrupt.kind} item is not approved or rejected.")
    actor = actor_for(user)
    edited = decision == Decision.APPROVED and edited_arguments is not None
    # Checked before any lock is taken: the tool's precondition and business key are the integrator's code.
    action_key = check_edited_arguments(_call_with_run(interrupt), edited_arguments) if edited else ""
    # The run first: the worker takes the same lock before it puts the run
    # to wait, so a decision cannot slip in between. Any error undoes the
    # whole decision; the three transitions log their events with one
    # reservation (the run's own, or the block's end).
    with locked(interrupt.run_id) as tx:
        interrupt = _lock_item(tx, interrupt.pk, decider=user, others_pending=True)
        _refuse_if_expired(interrupt)
        resumes = _unblocks(tx, interrupt)
        edits = {"changes": argument_changes(interrupt.proposed_arguments(), edited_arguments)} if edited else {}
        tx.apply(interrupt.resolve, actor=actor, reason=decision, payload=edits, decision=decision, user=user,
                 comment=comment, edited_arguments=edited_arguments, now=timezone.now())
        if decision == Decision.APPROVED:
            approve_tool_call(tx, interrupt.tool_call, arguments=edited_arguments, action_key=action_key,
                              actor=actor)
        else:
            reject_tool_call(tx, interrupt.tool_call, comment=comment, actor=actor)
        if resumes:
            tx.apply(tx.run.resume, actor=actor, reason="resumed after decision")
    record_decision(tx.run, interrupt)  # the approval's wait and its decision, in the run's trace (runs.base.tracing)
    return interrupt


def _call_with_run(interrupt: Interrupt) -> ToolCall:
    """The item's tool call with its run and the run's requester (what ``check_edited_arguments`` reads), in
    one query."""
    return ToolCall.objects.select_related("run__requested_by").get(pk=interrupt.tool_call_id)


def _refuse_if_expired(interrupt: Interrupt) -> None:
    """Raise ``Expired`` for a pending item whose ``expires_at`` has passed (by this server's clock)."""
    if interrupt.status == InterruptStatus.PENDING and interrupt.expires_at is not None \
            and interrupt.expires_at <= timezone.now():
        raise Expired(f"Inbox item {interrupt.pk} expired at {interrupt.expires_at.isoformat()}; "
                      "it can no longer be decided.", details={"expires_at": interrupt.expires_at.isoformat()})


def _unblocks(tx: RunTx, interrupt: Interrupt) -> bool:
    """Whether resolving ``interrupt`` lets its run ``tx.run`` resume: the run waits for people and no
    other item of it is pending. Call with the item locked by ``_lock_item(..., others_pending=True)``
    (under the run's lock, which every writer of the run's items takes first: neither changes until
    commit), before the item's transition. If so, a worker is woken on commit (``RunTx.wake``: ahead
    of the live push)."""
    run = tx.run
    # waiting for an approval or a settlement (a wait for an answer or an event ends with its wait)
    if run.waiting_reason not in (WaitingReason.APPROVAL, WaitingReason.RECONCILIATION) or not can_proceed(run.resume):
        return False
    if interrupt.others_pending:
        return False
    tx.wake()
    return True


def pending_items_locked(run_ids) -> list[Interrupt]:
    """The pending items of the runs ``run_ids``, locked (``SELECT ... FOR UPDATE`` of their rows), newest first.

    Call inside a transaction that already holds those runs' row locks
    (runs first, then items: the order every writer of both keeps).
    """
    return selects.select(Interrupt, {"run__in": list(run_ids), "status": InterruptStatus.PENDING}, for_update=True,
                          order_by=("-created_at", "-id"))


def cancel_pending_interrupts(*, run, actor: str, pending: list[Interrupt] | None = None) -> None:
    """Cancel the pending approval and input items of ``run`` (it is ending); reconciliation items stay (docs/design.md#ending-a-run).

    ``pending``: the items the caller loaded under its lock (``pending_items_locked``), else read here.
    """
    if pending is None:
        pending = pending_items_locked([run.pk])
    for interrupt in pending:
        if interrupt.status == InterruptStatus.PENDING and interrupt.kind != InterruptKind.RECONCILIATION:
            interrupt.run = run
            apply(interrupt.cancel, actor=actor, reason="run cancelled", now=timezone.now())
