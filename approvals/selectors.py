"""Reads for the inbox pages (HackSoft-style selectors).

Who may decide or look at an item is ``Interrupt.objects.decidable_by`` /
``visible_to`` (``runs.access``); these functions only load what a page shows.
"""

from dataclasses import dataclass

from django.db.models import Count

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from runs.models import RunEvent
from tools.models import ToolCallStatus
from tools.registry import get_tool
from tools.services.assessment import effective_rule

RULE_PREFIX = "approval rule: "


def _with_relations(queryset):
    return queryset.select_related("run", "run__agent", "run__requested_by", "tool_call", "resolved_by")


def inbox_items(*, user):
    """Pending items ``user`` may decide, newest first, in one query whatever their number.

    Each has ``same_action_calls``: how many later calls re-proposed its tool call's action.
    """
    return (_with_relations(Interrupt.objects.decidable_by(user).filter(status=InterruptStatus.PENDING))
            .annotate(same_action_calls=Count("tool_call__duplicates")).order_by("-created_at", "-id"))


def interrupt_get_visible(*, user, interrupt_id: int) -> Interrupt | None:
    """Item ``interrupt_id`` if ``user`` may look at it (else None), with ``user_may_decide`` set."""
    return (_with_relations(Interrupt.objects.visible_to(user).with_decidable_flag(user))
            .filter(pk=interrupt_id).first())


def run_pending_interrupts(*, run) -> list[Interrupt]:
    """The run's pending inbox items, oldest first."""
    return list(_with_relations(run.interrupts.filter(status=InterruptStatus.PENDING)).order_by("created_at", "id"))


def run_decided_interrupts(*, run) -> list[Interrupt]:
    """The run's decided (resolved) inbox items, in the order they were decided."""
    return list(_with_relations(run.interrupts.filter(status=InterruptStatus.RESOLVED)).order_by("resolved_at", "id"))


@dataclass(frozen=True)
class Why:
    """Why an item is in the inbox, from the record.

    ``rule``: the approval rule that fired (e.g. ``amount > 50``), as kept
    on the item, or for items opened before it was kept, as logged when the
    call was assessed; empty when neither has it. ``tool_rule`` and
    ``agent_rule``: the rules of the tool and of the run's agent now
    (``agent_rule`` empty: none);
    ``granted_by``: who let the agent's rule replace the tool's (empty:
    the agent's rule only adds). ``model_reason``: the text of the model's
    turn that proposed the call (empty if it said nothing), ``message_id``
    that turn's message (None if not found).
    """

    rule: str
    tool_rule: str
    agent_rule: str
    granted_by: str
    model_reason: str
    message_id: int | None


def interrupt_why(item: Interrupt, messages) -> Why | None:
    """``Why`` for an approval item (None for other kinds or without a registered tool).

    ``messages``: the session's messages (already loaded by the page), in
    which the assistant turn holding the call's id is looked up. No query
    when the item keeps its rule.
    """
    tool_call = item.tool_call
    tool = get_tool(tool_call.name) if tool_call is not None else None
    if item.kind != InterruptKind.APPROVAL or tool is None:
        return None
    rule = item.rule or _logged_rule(item)
    _rule, granted_by = effective_rule(item.run.agent, tool)
    turn = next((m for m in messages if m.role == "assistant" and m.run_id == item.run_id
                 and any(c.get("id") == tool_call.provider_call_id for c in m.tool_calls or [])), None)
    return Why(rule=rule, tool_rule=tool.approval,
               agent_rule=item.run.agent.approval_policy.get(tool.name) or "", granted_by=granted_by,
               model_reason=turn.content.strip() if turn else "", message_id=turn.pk if turn else None)


def _logged_rule(item: Interrupt) -> str:
    """The approval rule in the event that put the item's call to wait for approval ("" if none)."""
    reason = (RunEvent.objects.filter(run_id=item.run_id, type="tool_call", to_status=ToolCallStatus.AWAITING_APPROVAL,
                                      payload__tool_call=item.tool_call_id)
              .values_list("reason", flat=True).first() or "")
    return reason.removeprefix(RULE_PREFIX)


@dataclass(frozen=True)
class Lookup:
    """What a person must check to settle a reconciliation item, from the call and its log.

    ``last_check``: when the tool's reconcile hook last looked and found
    nothing (None: never), with ``last_check_result`` (what it reported).
    """

    idempotency_key: str
    error: str
    attempts: int
    reconcile_attempts: int
    last_check: object
    last_check_result: str


def reconciliation_lookup(item: Interrupt) -> Lookup | None:
    """``Lookup`` for a reconciliation item with a call (else None); one query (the last automatic check)."""
    call = item.tool_call
    if item.kind != InterruptKind.RECONCILIATION or call is None:
        return None
    last = (RunEvent.objects.filter(run_id=item.run_id, type="reconciliation", payload__tool_call=call.pk)
            .order_by("-seq").values_list("created_at", "reason").first())
    return Lookup(idempotency_key=call.idempotency_key, error=call.error, attempts=call.attempts,
                  reconcile_attempts=call.reconcile_attempts, last_check=last[0] if last else None,
                  last_check_result=last[1] if last else "")
