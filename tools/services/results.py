"""What calls leave for the model and for the run's end: result messages, and no call left in flight."""

import json

from django.db import transaction
from django.utils import timezone
from django_fsm import can_proceed

from runs.services import append_message
from runs.transitions import apply
from tools.models import ToolCall, ToolCallStatus
from tools.models.tool_call import PENDING_STATUSES
from tools.registry import get_tool
from tools.services.arguments import parse_raw_arguments

S = ToolCallStatus


def settle_calls_at_run_end(*, run, actor: str) -> list[dict]:
    """Leave no call of an ending ``run`` in flight; returns its effects (side-effecting calls not without effect).

    * never sent (proposed, awaiting approval, ready with no attempt), or a
      re-proposal waiting on its original -> ``cancelled``;
    * sent before and waiting to be sent again (``ready`` after a retryable
      failure or a crash): side-effecting -> ``unknown`` (an earlier attempt
      may have taken effect); read-only -> ``cancelled``, saying so;
    * ``running`` (its worker gave up on it, e.g. after an internal error):
      side-effecting -> ``unknown``; read-only -> ``failed``;
    * ``unknown`` stays unknown: ``reconcile_after`` is set so the sweeper
      keeps asking the tool's hook after the run has ended (a call with no
      hook is for a person; the caller opens that item).

    Each effect is ``{"tool_call": id, "name": str, "status": "succeeded" | "unknown"}``.
    """
    now = timezone.now()
    for tool_call in run.tool_calls.filter(status__in=[S.PROPOSED, S.AWAITING_APPROVAL, S.READY, S.RUNNING]):
        if tool_call.status == S.RUNNING and not tool_call.side_effect:
            apply(tool_call.fail, actor=actor, error="The run ended while this call was in flight.", now=now)
        elif tool_call.side_effect and can_proceed(tool_call.mark_unknown):  # sent: it may have taken effect
            apply(tool_call.mark_unknown, actor=actor, reason="run ended with the call in flight",
                  error=f"The run ended after {tool_call.attempts} attempt(s); whether it took effect "
                        "is unknown.")
        elif tool_call.attempts:
            apply(tool_call.cancel, actor=actor,
                  error=f"The run ended before attempt {tool_call.attempts + 1}; earlier attempts failed.")
        else:
            apply(tool_call.cancel, actor=actor)
    unknown = run.tool_calls.filter(status=S.UNKNOWN)
    for tool_call in unknown:
        tool = get_tool(tool_call.name)
        if tool is not None and tool.reconcile is not None:
            ToolCall.objects.filter(pk=tool_call.pk).update(reconcile_after=now)
    effects = run.tool_calls.filter(side_effect=True, status__in=[S.SUCCEEDED, S.UNKNOWN]).order_by("id")
    return [{"tool_call": pk, "name": name, "status": status}
            for pk, name, status in effects.values_list("id", "name", "status")]


def unknown_calls_for_a_person(run) -> list[ToolCall]:
    """``unknown`` calls of ``run`` whose tool has no ``reconcile`` hook: only a person can settle them."""
    return [call for call in run.tool_calls.filter(status=S.UNKNOWN)
            if (tool := get_tool(call.name)) is None or tool.reconcile is None]


def deliver_tool_results(run) -> None:
    """Append a tool message for every finished call of ``run`` that has none yet, in call order.

    Invalid, denied, rejected, expired and cancelled calls get one too, so
    the model never sees a call id without a result. ``unknown`` calls get
    none: what is known of them is rendered when a context is built
    (``runs.engine.context``), so a later settlement reaches the model.
    """
    delivered = set(run.messages.filter(role="tool").values_list("tool_call_id", flat=True))
    with transaction.atomic():
        for call in run.tool_calls.order_by("id"):
            if not call.is_pending and call.provider_call_id not in delivered:
                append_message(run, role="tool", content=tool_result_content(call),
                               tool_call_id=call.provider_call_id)


def tool_result_content(tool_call: ToolCall) -> str:
    """The tool-result text the model receives for a call (JSON).

    ``{"status": "succeeded", "result": ...}``;
    ``{"status": <invalid|denied|rejected|...>, "error": "..."}``;
    ``{"status": "unknown", "error": ...}`` while an outcome is being
    checked (never "did not run" for a call that was sent). A call a person
    approved also carries ``"approval": {"comment", "proposed_arguments",
    "approved_arguments"}`` (the argument pair only when they were edited).
    """
    if tool_call.status == S.SUCCEEDED:
        body = {"status": tool_call.status, "result": tool_call.result}
    elif tool_call.status in (S.UNKNOWN, S.RUNNING):
        body = {"status": S.UNKNOWN, "error": "Whether this call took effect is not known yet; it is being checked. "
                                              "Do not repeat it."}
    elif tool_call.status in PENDING_STATUSES:
        body = {"status": "pending", "error": "No result yet."}
    else:
        body = {"status": tool_call.status, "error": tool_call.error}
    approval = _approval_note(tool_call)
    if approval:
        body["approval"] = approval
    return json.dumps(body, default=str)


def _approval_note(tool_call: ToolCall) -> dict:
    """What the approver said and changed, for the model: ``{}`` when no person approved the call."""
    decision = (tool_call.interrupts.filter(decision="approved")
                .values("comment", "edited_arguments").first() if tool_call.pk else None)
    if decision is None:
        return {}
    note = {"comment": decision["comment"]} if decision["comment"] else {}
    edited = decision["edited_arguments"]
    if edited is not None:
        proposed, _ = parse_raw_arguments(tool_call.raw_arguments)
        if proposed != edited:
            note.update(proposed_arguments=proposed, approved_arguments=edited)
    return note
