"""Recording a model turn's calls with their assessments, and re-proposals of the same action.

Cumulative approval rules are judged again here, inside the proposing
transaction, with their scopes locked (docs/design.md#approval-rules).
"""

import dataclasses
import functools
import json
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from runs.services import Event, append_event, append_events
from runs.transitions import apply
from tools.models import ToolCall, ToolCallStatus
from tools.models.tool_call import FINAL_STATUSES
from tools.policy import Cumulative, approval_required, cumulative_clauses
from tools.registry import Tool
from tools.services.targets import calls_on, lock_scopes, scope_lock_key, target_key, target_of
from tools.services.assessment import Assessed, Assessment

S = ToolCallStatus

# Calls a cumulative rule counts: done, under way, or still to be decided.
COUNTED_STATUSES = [S.PROPOSED, S.AWAITING_APPROVAL, S.READY, S.RUNNING, S.SUCCEEDED, S.UNKNOWN]


def _scope_key(run, tool: Tool, clause: Cumulative, arguments: dict) -> str | None:
    """The ``PolicyLock`` key of ``clause``'s scope for this call; None if its target is missing.

    A ``target`` scope's key is the target's own (``tools.services.targets``):
    sends on the target lock the same row.
    """
    if clause.scope == "run":
        return scope_lock_key(tool.name, f"run:{run.pk}")
    if clause.scope == "user":
        return scope_lock_key(tool.name, f"user:{run.requested_by_id}")
    target = target_of(tool, arguments)
    return target.lock_key if target is not None else None


def _earlier_arguments(run, tool: Tool, clause: Cumulative, arguments: dict) -> list[dict]:
    """Arguments of the counted calls of ``tool`` in ``clause``'s scope and window (this call not yet stored)."""
    # A re-proposal of an action (``duplicate_of``) is the same action: counted once, as its original.
    if clause.scope == "target":  # the target's calls, through ToolCall.target's index
        calls = calls_on(target_of(tool, arguments))
    else:
        calls = ToolCall.objects.filter(name=tool.name)
    calls = calls.filter(status__in=COUNTED_STATUSES, duplicate_of__isnull=True).order_by()
    if clause.scope == "run":
        calls = calls.filter(run_id=run.pk)
    elif clause.scope == "user":
        calls = calls.filter(run__requested_by_id=run.requested_by_id)
    if clause.window_s is not None:
        calls = calls.filter(created_at__gte=timezone.now() - timedelta(seconds=clause.window_s))
    return [args or {} for args in calls.values_list("arguments", flat=True)]


def _lock_cumulative_scopes(run, assessments: list[Assessment]) -> None:
    """Lock the ``PolicyLock`` row of every scope a ready call's cumulative rule counts, in key order.

    Until the caller's transaction ends, no other proposal can count (or
    add to) the same scopes: two concurrent calls cannot both slip under.
    """
    keys = {
        _scope_key(run, a.tool, clause, a.arguments)
        for a in assessments if a.outcome == Assessed.MAKE_READY
        for clause in cumulative_clauses(a.rule)
    } - {None}
    lock_scopes(keys)


def _asks_with_history(run, tool: Tool, rule: str, arguments: dict) -> bool:
    """Whether ``rule`` asks for approval, counting the earlier calls its cumulative clauses name.

    A cumulative ``per target`` clause on a call without a target asks.
    """
    if any(_scope_key(run, tool, clause, arguments) is None for clause in cumulative_clauses(rule)):
        return True
    return approval_required(rule, arguments, lambda clause: _earlier_arguments(run, tool, clause, arguments))


def _judge_with_history(run, assessment: Assessment) -> Assessment:
    """A ``make_ready`` decision judged again with the calls its cumulative clauses count.

    Call with the scopes locked (``_lock_cumulative_scopes``). Returns the
    assessment unchanged, or one asking for approval.
    """
    if assessment.outcome != Assessed.MAKE_READY or not cumulative_clauses(assessment.rule):
        return assessment
    if not _asks_with_history(run, assessment.tool, assessment.rule, assessment.arguments):
        return assessment
    return dataclasses.replace(assessment, outcome=Assessed.REQUEST_APPROVAL,
                               reason=f"approval rule: {assessment.rule} (counting earlier calls)")


def _loosened(run, assessment: Assessment) -> bool:
    """Whether a call goes ahead unapproved only because a granted agent rule replaced the tool's.

    Call before the call is stored (it must not count itself).
    """
    tool = assessment.tool
    return (assessment.outcome == Assessed.MAKE_READY and bool(assessment.granted_by)
            and _asks_with_history(run, tool, tool.approval, assessment.arguments))


def propose_tool_calls(
    *, run, step, calls: list[dict], assessments: list[Assessment], actor: str = "worker"
) -> list[ToolCall]:
    """Record the calls of one model turn with their ``assess_tool_calls`` decisions (database only).

    Each call ends ``invalid``, ``denied``, ``awaiting_approval``, ``ready``,
    or linked to an earlier call of the same action. The caller opens the
    inbox item of each ``awaiting_approval`` call in the same transaction
    (the engine does: ``approvals.services.request_approval``).
    ``calls[i]["id"]`` must be unique in the session.
    A ``ready`` decision under a cumulative rule is judged again here, with
    the rule's scopes locked and the calls already stored (this turn's
    earlier ones included) counted. A call that goes ahead only because a
    granted agent rule replaced the tool's gets a ``policy`` event.
    """
    created: list[ToolCall] = []
    with transaction.atomic(savepoint=False):  # all or nothing: an error ends the caller's transaction too
        _lock_cumulative_scopes(run, assessments)
        for index, (call, assessment) in enumerate(zip(calls, assessments, strict=True)):
            assessment = _judge_with_history(run, assessment)
            loosened = _loosened(run, assessment)
            raw = call.get("arguments")
            tool_call = ToolCall(
                run=run, step=step, index=index, provider_call_id=call["id"],
                name=str(call.get("name") or "")[:100],
                raw_arguments=raw if isinstance(raw, str) else json.dumps(raw),
                arguments=assessment.arguments,
                side_effect=bool(assessment.tool and assessment.tool.side_effect),
                action_key=assessment.action_key, target=target_key(assessment.tool, assessment.arguments),
            )
            proposal_events = functools.partial(_proposal_events, call=call, assessment=assessment,
                                                loosened=loosened, actor=actor)
            if assessment.outcome == Assessed.DUPLICATE:
                tool_call.save()
                append_events(run, proposal_events(tool_call))
                original = assessment.original
                _join(tool_call, created[original] if isinstance(original, int) else original, actor=actor)
            else:  # stored in its assessed status; the log still says proposed first
                transition, keywords = _assessed(tool_call, assessment)
                apply(transition, actor=actor, savepoint=False, logged_before=proposal_events, **keywords)
            created.append(tool_call)
    return created


def _assessed(tool_call: ToolCall, assessment: Assessment) -> tuple:
    """The transition out of ``proposed`` that ``assessment`` decided, with the keywords ``apply`` takes for it."""
    said_as = "error" if assessment.outcome in (Assessed.INVALIDATE, Assessed.DENY) else "reason"
    return getattr(tool_call, assessment.outcome), {said_as: assessment.reason}


def _proposal_events(tool_call: ToolCall, *, call: dict, assessment: Assessment, loosened: bool,
                     actor: str) -> list[Event]:
    """A stored call's proposal events: ``proposed``, and ``policy`` if a loosened rule let it through."""
    payload = {"tool_call": tool_call.pk, "name": tool_call.name}
    if call.get("original_id"):
        payload["original_id"] = call["original_id"]
    events = [Event(type="tool_call", actor=actor, reason="proposed", payload=payload, to_status=S.PROPOSED)]
    if loosened:
        events.append(Event(type="policy", actor=actor, reason="loosened approval rule applied",
                            payload={"tool_call": tool_call.pk, "tool_rule": assessment.tool.approval,
                                     "agent_rule": assessment.rule, "granted_by": assessment.granted_by}))
    return events


def _join(tool_call: ToolCall, original: ToolCall, *, actor: str) -> None:
    """Link a re-proposed action to its ``original``: settled now if that finished, else when it does."""
    tool_call.duplicate_of = original
    ToolCall.objects.filter(pk=tool_call.pk).update(duplicate_of=original)
    original.refresh_from_db()
    if original.status in FINAL_STATUSES:
        settle_duplicate(tool_call, actor=actor)
        return
    append_event(tool_call.run, type="tool_call", actor=actor, reason=f"same action as #{original.pk}: waits for it",
                 payload={"tool_call": tool_call.pk, "name": tool_call.name, "duplicate_of": original.pk})


def settle_duplicate(tool_call: ToolCall, *, actor: str) -> ToolCall:
    """End a re-proposed call as its finished original ended: its result is replayed, nothing runs again."""
    original = tool_call.duplicate_of
    verb = "result reused" if original.status == S.SUCCEEDED else f"ended {original.status}"
    return apply(tool_call.settle_as_duplicate, actor=actor,
                 reason=f"same action as #{original.pk}: {verb}", original=original, now=timezone.now())


def settle_joined_calls(run) -> list[ToolCall]:
    """Settle every re-proposed call of ``run`` whose original has finished; returns those still waiting.

    A call still waiting has an original that is pending elsewhere (e.g. an
    unknown outcome of an earlier run of the session, being reconciled).
    """
    waiting = []
    for tool_call in run.tool_calls.filter(status=S.PROPOSED, duplicate_of__isnull=False).select_related(
            "duplicate_of"):
        if tool_call.duplicate_of.status in FINAL_STATUSES:
            settle_duplicate(tool_call, actor="worker")
        else:
            waiting.append(tool_call)
    return waiting
