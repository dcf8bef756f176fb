"""Human decisions: open inbox items, resolve them, resume the run.

Only an authenticated user holding the item's permission resolves an item,
through ``decide_interrupt``; the web inbox, the REST API and the admin all
call it. Text in a model's output never reaches this module.
"""

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from approvals.models import Decision, Interrupt, InterruptKind, InterruptStatus
from runs.models import Run, RunStatus, WaitingReason
from runs.services import actor_for, append_event, enqueue_advance, transition_run


def _log(interrupt: Interrupt, *, actor: str, reason: str, from_status: str = "") -> None:
    append_event(
        interrupt.run,
        type="interrupt",
        actor=actor,
        reason=reason,
        payload={"interrupt": interrupt.pk, "kind": interrupt.kind, "decision": interrupt.decision,
                 "comment": interrupt.comment},
        from_status=from_status,
        to_status=interrupt.status,
    )


def request_approval(*, tool_call, tool) -> Interrupt:
    """Open a pending approval item for ``tool_call`` (a ``tools.registry.Tool``).

    It expires after ``TOLLGATE["APPROVAL_TTL_HOURS"]``. The run is moved
    to ``waiting/approval`` by the loop, once every call of the turn has
    been proposed.
    """
    interrupt = Interrupt.objects.create(
        run=tool_call.run,
        tool_call=tool_call,
        kind=InterruptKind.APPROVAL,
        title=f"Approve {tool_call.name}?",
        required_permission=tool.permission,
        allow_requester=tool.allow_requester_approval,
        expires_at=timezone.now() + timedelta(hours=settings.TOLLGATE["APPROVAL_TTL_HOURS"]),
    )
    _log(interrupt, actor="worker", reason="approval requested")
    return interrupt


def can_decide(user, interrupt: Interrupt) -> bool:
    """Whether ``user`` may resolve ``interrupt``: permission, and the requester rule."""
    if not user.is_authenticated or not user.has_perm(interrupt.required_permission):
        return False
    return interrupt.allow_requester or interrupt.run.requested_by_id != user.pk


def decide_interrupt(
    *, interrupt: Interrupt, user, decision: str, comment: str = "", edited_arguments: dict | None = None
) -> Interrupt:
    """Resolve an approval item: ``decision`` is ``approved`` or ``rejected``.

    The tool call becomes ``ready`` (with ``edited_arguments`` if given)
    or ``rejected``; once no item of the run is pending, the run resumes
    and a worker is woken. Raises ``PermissionDenied`` (403),
    ``TransitionNotAllowed`` when the item is no longer pending (409) and
    ``ValueError`` for edited arguments that break the tool's schema.
    """
    from tools.services import approve_tool_call, reject_tool_call

    if decision not in (Decision.APPROVED, Decision.REJECTED):
        raise ValueError(f"Unknown decision {decision!r}.")
    if not can_decide(user, interrupt):
        raise PermissionDenied("You may not decide this item.")
    actor = actor_for(user)
    with transaction.atomic():
        # Lock the run first: the worker takes the same lock before it puts
        # the run to wait, so a decision cannot slip in between.
        Run.objects.select_for_update().get(pk=interrupt.run_id)
        interrupt = Interrupt.objects.select_for_update().get(pk=interrupt.pk)
        from_status = interrupt.status
        interrupt.resolve(decision=decision, user=user, comment=comment,
                          edited_arguments=edited_arguments, now=timezone.now())
        interrupt.save()
        if decision == Decision.APPROVED:
            approve_tool_call(tool_call=interrupt.tool_call, arguments=edited_arguments, actor=actor)
        else:
            reject_tool_call(tool_call=interrupt.tool_call, comment=comment, actor=actor)
        _log(interrupt, actor=actor, reason=decision, from_status=from_status)
        _resume_if_unblocked(interrupt.run, actor=actor)
    return interrupt


def _resume_if_unblocked(run, *, actor: str) -> None:
    run.refresh_from_db()
    if run.interrupts.filter(status=InterruptStatus.PENDING).exists():
        return
    if run.status == RunStatus.WAITING and run.waiting_reason == WaitingReason.APPROVAL:
        transition_run(run, "resume", actor=actor, reason="resumed after decision")
        enqueue_advance(run.pk)


def cancel_pending_interrupts(*, run, actor: str) -> None:
    """Cancel every pending item of ``run`` (the run is being cancelled)."""
    for interrupt in run.interrupts.select_for_update().filter(status=InterruptStatus.PENDING):
        from_status = interrupt.status
        interrupt.cancel(now=timezone.now())
        interrupt.save()
        _log(interrupt, actor=actor, reason="run cancelled", from_status=from_status)
