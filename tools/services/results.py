"""What calls leave for the model and for the run's end: result messages, and no call left in flight."""

import json
from collections.abc import Collection

from django.db import transaction
from django.utils import timezone
from django_fsm import can_proceed

from runs import lease
from runs.base import selects
from runs.base.rows import insert_many as insert_rows
from runs.services import new_message
from runs.transitions import apply
from tools.models import ToolCall, ToolCallStatus
from tools.models.tool_call import PENDING_STATUSES
from tools.registry import get_tool
from tools.services.edits import proposed_arguments
from tools.services.targets import release_on_commit

S = ToolCallStatus
# Reached only before any approval (from proposed or awaiting_approval): such a call has no approval note.
NEVER_APPROVED = (S.INVALID, S.REJECTED, S.EXPIRED)


def settle_calls_at_run_end(*, run, calls: list[ToolCall], actor: str) -> list[dict]:
    """Leave no call of an ending ``run`` in flight; returns its effects (side-effecting calls not without effect).

    ``calls``: the run's tool calls in id order (changed in place).

    * never sent (proposed, awaiting approval, ready with no attempt), or a
      re-proposal waiting on its original -> ``cancelled``;
    * sent before and waiting to be sent again (``ready`` after a retryable
      failure or a crash): side-effecting -> ``unknown`` (an earlier attempt
      may have taken effect) unless no attempt may have left
      (``ToolCall.maybe_sent``: each was ``ToolNotSent``); else -> ``cancelled``, saying so;
    * ``running`` (its worker gave up on it, e.g. after an internal error):
      side-effecting -> ``unknown``; read-only -> ``failed``;
    * ``unknown`` stays unknown: ``reconcile_after`` is set so the sweeper
      keeps asking the tool's hook after the run has ended (a call with no
      hook is for a person; the caller opens that item).

    A ``ready`` or ``running`` call may hold its target's claim
    (``tools.services.targets``): once the ending commits, its waiters are
    woken (``release_on_commit``).

    Each effect is ``{"tool_call": id, "name": str, "status": "succeeded" | "unknown", "reused": bool,
    "duplicate_of": id | None}``: ``reused`` when the call was answered with an earlier call's result (the
    same action, ``duplicate_of``), which is not a new effect (count effects without it, e.g. to bill).
    """
    now = timezone.now()
    claimable = [call for call in calls if call.status in (S.READY, S.RUNNING)]  # may hold their target
    for tool_call in calls:
        if tool_call.status not in (S.PROPOSED, S.AWAITING_APPROVAL, S.READY, S.RUNNING):
            continue
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
    release_on_commit(claimable, actor=actor)  # their targets' waiters go on now, not at their wake_at
    hooked = [call.pk for call in calls
              if call.status == S.UNKNOWN and getattr(get_tool(call.name), "reconcile", None) is not None]
    if hooked:
        ToolCall.objects.filter(pk__in=hooked).update(reconcile_after=now)
    return [{"tool_call": call.pk, "name": call.name, "status": call.status,
             "reused": call.status == S.SUCCEEDED and call.duplicate_of_id is not None,
             "duplicate_of": call.duplicate_of_id if call.status == S.SUCCEEDED else None}
            for call in calls if call.side_effect and call.status in (S.SUCCEEDED, S.UNKNOWN)]


def unknown_calls_for_a_person(calls: list[ToolCall]) -> list[ToolCall]:
    """The ``unknown`` ones of ``calls`` whose tool has no ``reconcile`` hook: only a person can settle them."""
    return [call for call in calls
            if call.status == S.UNKNOWN and ((tool := get_tool(call.name)) is None or tool.reconcile is None)]


def deliver_tool_results(run, *, calls: list[ToolCall] | None = None, history: list | None = None,
                         fence: bool = True, never_asked: Collection[int] = ()) -> list:
    """Append a tool message for every finished call of ``run`` that has none yet, in call order, in one
    statement; returns them (``tool_result_messages``, stored).

    ``fence=False``: the caller's transaction makes a fenced write of its
    own (see ``runs.services.append_message``).
    """
    messages = tool_result_messages(run, calls=calls, history=history, never_asked=never_asked)
    if messages:
        # One transaction: the lease check's row lock holds off a takeover until the messages are in.
        with transaction.atomic(savepoint=False):
            if fence:
                lease.check(run.pk)
            insert_rows(messages)
    return messages


def tool_result_messages(run, *, calls: list[ToolCall] | None = None, history: list | None = None,
                         never_asked: Collection[int] = ()) -> list:
    """The tool message for every finished call of ``run`` that has none yet, in call order, not stored
    (``runs.services.new_message``): ``deliver_tool_results`` stores them, or a caller stores them with the
    outcome that finished the last call (``runs.services.append_events``' ``inserts``).

    Invalid, denied, rejected, expired and cancelled calls get one too, so
    the model never sees a call id without a result. ``unknown`` calls get
    none: what is known of them is rendered when a context is built
    (``runs.engine.context``), so a later settlement reaches the model.
    A caller that has them loaded passes ``calls`` (the run's tool calls in
    id order) and ``history`` (the session's messages); else they are read.
    ``never_asked``: ids of calls
    the caller knows never asked for approval (e.g. proposed ``ready`` by
    the same worker: ``runs.engine.state.Known.assessed_here``); no approval
    note is looked up for them. Reads (approval and reuse notes), writes nothing.
    """
    if history is None:
        delivered = set(run.messages.filter(role="tool").values_list("tool_call_id", flat=True))
    else:
        delivered = {m.tool_call_id for m in history if m.run_id == run.pk and m.role == "tool"}
    if calls is None:
        calls = list(run.tool_calls.order_by("id"))
    due = [call for call in calls if not call.is_pending and call.provider_call_id not in delivered]
    if not due:
        return []
    notes = _approval_notes(due, never_asked=never_asked)
    reused = _reuse_notes(due)
    return [new_message(run, role="tool", content=_content(call, notes.get(call.pk, {}), reused.get(call.pk)),
                        tool_call_id=call.provider_call_id)
            for call in due]


def tool_result_content(tool_call: ToolCall) -> str:
    """The tool-result text (JSON) the model receives for a call (docs/integrating.md#6-the-model-wire-contract).

    ``{"status": "succeeded", "result"}`` or ``{"status", "error"}`` (a sent call being checked is ``unknown``, never "did not
    run"); plus ``"approval": {"comment", "proposed_arguments"?, "approved_arguments"?}``, ``"reused": {"tool_call", "run", "done_at", "note"}``.
    """
    if not tool_call.pk:
        return _content(tool_call, {}, None)
    return _content(tool_call, _approval_notes([tool_call]).get(tool_call.pk, {}),
                    _reuse_notes([tool_call]).get(tool_call.pk))


def _content(tool_call: ToolCall, approval: dict, reused: dict | None) -> str:
    """``tool_result_content`` of a call whose approval note (``_approval_notes``) and reuse note
    (``_reuse_notes``) are known."""
    if tool_call.status == S.SUCCEEDED:  # the reuse note, if any, is read ahead of the result
        body = {"status": tool_call.status, **({"reused": reused} if reused else {}), "result": tool_call.result}
    elif tool_call.status in (S.UNKNOWN, S.RUNNING):
        body = {"status": S.UNKNOWN, "error": "Whether this call took effect is not known yet; it is being checked. "
                                              "Do not repeat it."}
    elif tool_call.status in PENDING_STATUSES:
        body = {"status": "pending", "error": "No result yet."}
    else:
        body = {"status": tool_call.status, "error": tool_call.error}
    if approval:
        body["approval"] = approval
    return json.dumps(body, default=str)


def _reuse_notes(tool_calls: list[ToolCall]) -> dict[int, dict]:
    """For each succeeded call answered with an earlier call's result, by call id: what the model is told of
    that earlier call (its id, run, when it was done) and that nothing was done again. One query, none when
    no call was answered so."""
    reused = {call.pk: call.duplicate_of_id for call in tool_calls
              if call.status == S.SUCCEEDED and call.duplicate_of_id is not None}
    if not reused:
        return {}
    originals = {pk: (run_id, done_at) for pk, run_id, done_at in
                 ToolCall.objects.filter(pk__in=set(reused.values())).values_list("pk", "run_id", "finished_at")}
    notes = {}
    for call_id, original in reused.items():
        run_id, done_at = originals.get(original, (None, None))
        notes[call_id] = {
            "tool_call": original, "run": run_id, "done_at": done_at.isoformat() if done_at else None,
            "note": f"This action was already done by call #{original} of run #{run_id}"
                    f"{f' at {done_at.isoformat()}' if done_at else ''}. This is that call's result: "
                    "it was not done again.",
        }
    return notes


def _approval_notes(tool_calls: list[ToolCall], *, never_asked: Collection[int] = ()) -> dict[int, dict]:
    """What a person who approved each call said and changed, for the model, by call id (one query).

    A call no person approved has no entry; of several approvals the newest speaks.
    Calls in ``NEVER_APPROVED`` statuses and those whose id is in
    ``never_asked`` are not asked about (no query when all are).
    """
    by_id = {call.pk: call for call in tool_calls if call.status not in NEVER_APPROVED and call.pk not in never_asked}
    if not by_id:
        return {}
    items = ToolCall._meta.get_field("interrupts").related_model  # the inbox's model, which depends on this layer
    decisions = selects.values(items, {"tool_call__in": list(by_id), "decision": "approved"},
                               ("tool_call", "comment", "edited_arguments"), order_by="-created_at")
    notes: dict[int, dict] = {}
    for call_id, comment, edited in decisions:
        if call_id in notes:
            continue
        note = {"comment": comment} if comment else {}
        if edited is not None:
            proposed = proposed_arguments(by_id[call_id])
            if proposed != edited:
                note.update(proposed_arguments=proposed, approved_arguments=edited)
        notes[call_id] = note
    return notes
