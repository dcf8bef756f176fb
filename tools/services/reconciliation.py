"""Unknown outcomes: ask the tool's ``reconcile`` hook, or record what a person found out."""

from enum import StrEnum

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs.services import append_event
from runs.transitions import apply
from tools.models import ToolCall
from tools.registry import get_tool
from runs.base.awaiting import Steps
from tools.services.execution import ask_reconcile, charged_attempts


class Reconciled(StrEnum):
    """What asking a ``reconcile`` hook about an unknown call came to (``reconcile_unknown_call``)."""

    SETTLED = "settled"  # the hook said succeeded or failed: the call is now too
    RESEND = "resend"  # the call is ready again, to be sent under the same key
    LATER = "later"  # no trace yet, or the external system could not be asked: again after reconcile_delay
    PERSON = "person"  # no hook, or RECONCILE_MAX_TRIES tries found nothing: only a person can settle it


def reconcile_unknown_call(tool_call: ToolCall, *, actor: str, resend: bool = False) -> Steps:
    """Ask the tool's ``reconcile`` hook about an ``unknown`` call; a step (``runs.base.awaiting``) returning ``Reconciled``.

    A hook that raises counts as a try that learned nothing (``LATER``, or
    ``PERSON`` after ``RECONCILE_MAX_TRIES``); nothing is ever guessed.

    ``resend``: the caller holds the run's lease and sends ``ready`` calls
    next (the loop; never once the run has ended). Then a call of an
    ``idempotent`` tool with attempts left (``charged_attempts < max_attempts``)
    that the external system answered it has no trace of is requeued
    (unless this was its ``RECONCILE_MAX_TRIES``-th try: a call that is
    never sent again, e.g. its precondition says no after every look, goes
    to a person in the end, see ``execute_tool_call``), to
    be sent again under the same idempotency key, as after a crash: the
    key makes a late first send and the new one a single effect, and the
    answer settles the call (e.g. a 503 that came after the client's
    timeout left a refund ``unknown`` that never happened).
    """
    tool = get_tool(tool_call.name)
    if tool is None or tool.reconcile is None:
        return Reconciled.PERSON
    ToolCall.objects.filter(pk=tool_call.pk).update(reconcile_attempts=F("reconcile_attempts") + 1)
    tool_call.refresh_from_db()
    found = yield from ask_reconcile(tool, tool_call)
    if found.status == "succeeded":
        apply(tool_call.succeed, actor=actor, reason="reconciled automatically",
              result=found.result, now=timezone.now())
        return Reconciled.SETTLED
    if found.status == "failed":
        apply(tool_call.fail, actor=actor, reason="reconciled automatically",
              error=found.error or "The external system reports that the call failed.", now=timezone.now())
        return Reconciled.SETTLED
    if resend and found.status == "not_found" and not found.error and tool.idempotent \
            and charged_attempts(tool_call) < tool.max_attempts \
            and tool_call.reconcile_attempts < settings.TOLLGATE["RECONCILE_MAX_TRIES"]:
        apply(tool_call.requeue, actor=actor, reason="no trace at the external system: sending again, same key",
              error="The external system has no trace of this call; it is sent again under the same key.")
        return Reconciled.RESEND
    with transaction.atomic():
        append_event(tool_call.run, type="reconciliation", actor=actor, reason=found.error or "not found yet",
                     payload={"tool_call": tool_call.pk, "try": tool_call.reconcile_attempts})
    if tool_call.reconcile_attempts >= settings.TOLLGATE["RECONCILE_MAX_TRIES"]:
        return Reconciled.PERSON
    return Reconciled.LATER


def reconcile_delay(tool_call: ToolCall) -> float:
    """Seconds before the next automatic reconciliation try (doubling from RECONCILE_BACKOFF_S)."""
    return settings.TOLLGATE["RECONCILE_BACKOFF_S"] * 2 ** max(tool_call.reconcile_attempts - 1, 0)


def settle_unknown_call(*, tool_call: ToolCall, succeeded: bool, result, evidence: str, actor: str) -> ToolCall:
    """A person reconciled an ``unknown`` call: ``succeeded`` with ``result``, or ``failed``; evidence kept."""
    if succeeded:
        return apply(tool_call.succeed, actor=actor, reason=f"reconciled by a person: {evidence}",
                     result=result, now=timezone.now())
    return apply(tool_call.fail, actor=actor, reason=f"reconciled by a person: {evidence}",
                 error=f"Reconciled as failed: {evidence}", now=timezone.now())
