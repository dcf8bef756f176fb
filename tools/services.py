"""Tool calls: validate, apply policy, execute, and report the result.

Every ``ToolCall`` state change happens here and is recorded as a run event
of type ``tool_call``. The model's text has no say: validity is the JSON
Schema, permission is the precondition and the approval rule, and a call
that needs approval runs only after ``approvals.services`` says so.
"""

import dataclasses
import hashlib
import json
import logging
import random
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import DataError, IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from runs.errors import InvalidInput
from runs.failpoints import failpoint
from runs.model_output import UnsafeArguments, parse_arguments
from runs.services import append_event, append_message
from tools.models import PolicyLock, ToolCall, ToolCallStatus
from tools.models.tool_call import FINAL_STATUSES, NO_EFFECT_STATUSES, PENDING_STATUSES
from tools.policy import Cumulative, approval_required, combine, cumulative_clauses
from tools.registry import (
    Reconciliation,
    Tool,
    ToolContext,
    ToolError,
    ToolTimeout,
    ToolUnavailable,
    get_tool,
    tools_for_agent,
)

log = logging.getLogger(__name__)
S = ToolCallStatus


def _transition(tool_call: ToolCall, name: str, *, actor: str, reason: str = "", **kwargs) -> ToolCall:
    """Apply the FSM transition ``name`` to ``tool_call``, save it and log an event.

    Raises ``TransitionNotAllowed`` / ``ConcurrentTransition`` (nothing saved).
    """
    with transaction.atomic():
        from_status = tool_call.status
        getattr(tool_call, name)(**kwargs)
        tool_call.save()
        payload = {"tool_call": tool_call.pk, "name": tool_call.name}
        if tool_call.error:
            payload["error"] = tool_call.error
        append_event(
            tool_call.run,
            type="tool_call",
            actor=actor,
            reason=reason or name,
            payload=payload,
            from_status=from_status,
            to_status=tool_call.status,
        )
    return tool_call


def canonical_value(value):
    """``value`` with every number written one way (``80``, ``80.0`` and ``8E+1`` alike)."""
    if isinstance(value, dict):
        return {key: canonical_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [canonical_value(item) for item in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(Decimal(str(value)).normalize(), "f")
    return value


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _canonical_json(arguments: dict) -> str:
    return json.dumps(canonical_value(arguments), sort_keys=True, separators=(",", ":"), default=str)


def action_identity(session_id: int, name: str, arguments: dict) -> str:
    """The business identity of one action in a session: 64 hex digits of sha256(session, tool, arguments).

    Arguments are canonicalised (sorted keys, no spaces, one spelling per
    number), so the same action proposed again, in any run of the session
    and under any ``tool_call_id``, has the same identity.
    """
    return _digest(str(session_id), name, _canonical_json(arguments))


def derive_idempotency_key(session_id: int, name: str, arguments: dict) -> str:
    """The idempotency key for executing ``name(arguments)`` in a session.

    ``"<tool>-s<session>-<first 32 hex digits of the identity>"``, followed
    by ``-<n>`` when ``n`` earlier calls sent under that key definitely
    failed: a fresh attempt after a failure must not be answered with the
    stored failure. The same action executed again (a re-send after a crash,
    a re-proposal, a follow-up run) gets the same key, so it takes effect
    at most once.
    """
    base = f"{name[:30]}-s{session_id}-{action_identity(session_id, name, arguments)[:32]}"
    failed = ToolCall.objects.filter(run__session_id=session_id, status=S.FAILED, idempotency_key__startswith=base)
    generation = failed.count()
    return f"{base}-{generation}" if generation else base


def _parse_arguments(raw) -> tuple[dict | None, str]:
    """(arguments, error): parse a raw arguments string strictly (``runs.model_output.parse_arguments``)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, ""
    if not isinstance(raw, str):  # screened responses carry text; anything else is re-read as text
        raw = json.dumps(raw, allow_nan=True, default=str)
    try:
        return parse_arguments(raw), ""
    except UnsafeArguments as exc:
        return None, str(exc)


@dataclass(frozen=True)
class Assessment:
    """What the policy decided for one proposed call, before anything is written.

    ``outcome`` is the ToolCall transition to apply: ``invalidate``,
    ``deny``, ``request_approval`` or ``make_ready``; or ``duplicate``
    when the call repeats an action that succeeded or is still pending
    (``original``: the earlier ``ToolCall``, or the index of an earlier
    call of the same turn). ``reason`` is the error (invalid, denied) or
    the approval rule that applied. ``action_key``: the call's business
    identity, for side-effecting calls with parsed arguments. ``rule`` is
    the approval rule; ``granted_by`` names who allowed the agent's rule to
    replace the tool's (empty: the agent's rule could only add approvals).
    """

    arguments: dict | None
    outcome: str
    reason: str
    tool: Tool | None = None
    action_key: str = ""
    original: "ToolCall | int | None" = None
    rule: str = ""
    granted_by: str = ""


def effective_rule(agent, tool: Tool) -> tuple[str, str]:
    """(rule, granted_by): the approval rule for ``tool`` in ``agent``'s runs.

    An agent's own rule is added to the tool's (approval when either asks),
    unless a holder of ``runs.loosen_approval_policy`` saved the agent's
    policy (``Agent.approval_policy_granted_by``): then it replaces the
    tool's, and ``granted_by`` is that user's name (else "").
    """
    agent_rule = agent.approval_policy.get(tool.name)
    grantor = agent.approval_policy_granted_by
    if agent_rule is not None and grantor is not None:
        return agent_rule, grantor.get_username()
    return combine(tool.approval, agent_rule), ""


def assess_tool_calls(*, run, calls: list[dict], truncated: bool) -> list[Assessment]:
    """Decide what happens to each call of one model turn; writes nothing.

    ``calls`` is ``[{"id", "name", "arguments": str | dict}]`` as the
    provider returned them; ``truncated`` is True when the output was cut
    off (``finish_reason=length``). Unknown tool, unparsable, truncated or
    schema-breaking arguments -> ``invalidate``; a failed precondition ->
    ``deny``; else the approval rule decides. Preconditions may do I/O
    (the refund asks the gateway), so call this outside any transaction.
    """
    allowed = {tool.name: tool for tool in tools_for_agent(run.agent)}
    assessments: list[Assessment] = []
    for call in calls:
        name = str(call.get("name") or "")
        tool = allowed.get(name)
        arguments, error = _parse_arguments(call.get("arguments"))
        if truncated:
            arguments, error = None, "The output was cut off (finish_reason=length); the arguments are incomplete."
        elif call.get("refused"):
            error = call["refused"]
        key = action_identity(run.session_id, name, arguments) if tool and tool.side_effect and not error else ""
        original = _same_action(run, key, assessments) if key else None
        if original is not None:
            assessments.append(Assessment(arguments, "duplicate", "", tool, action_key=key, original=original))
            continue
        if tool is None and not error:
            error = f"Unknown tool {name!r}. Available tools: {', '.join(sorted(allowed))}."
        elif arguments is not None and not error:
            problems = tool.schema_errors(arguments)
            if problems:
                error = "Arguments do not match the schema: " + "; ".join(problems)
        if error:
            assessments.append(Assessment(arguments, "invalidate", error, tool, action_key=key))
            continue
        denial = tool.precondition(ToolContext(run=run, user=run.requested_by), arguments) if tool.precondition else None
        if denial:
            assessments.append(Assessment(arguments, "deny", denial, tool, action_key=key))
            continue
        rule, granted_by = effective_rule(run.agent, tool)
        outcome = "request_approval" if approval_required(rule, arguments) else "make_ready"
        assessments.append(Assessment(arguments, outcome, f"approval rule: {rule}", tool, action_key=key, rule=rule,
                                      granted_by=granted_by))
    return assessments


def _same_action(run, key: str, earlier_in_turn: list[Assessment]) -> "ToolCall | int | None":
    """The call that already stands for action ``key``: earlier in this turn, or earlier in the session.

    Only an original that succeeded or is still pending counts; an action
    that ended without effect may be proposed (and assessed) afresh.
    """
    for index, assessment in enumerate(earlier_in_turn):
        if assessment.action_key == key and assessment.outcome in ("duplicate", "request_approval", "make_ready"):
            return assessment.original if assessment.outcome == "duplicate" else index
    latest = (ToolCall.objects.filter(run__session_id=run.session_id, action_key=key)
              .exclude(status__in=NO_EFFECT_STATUSES).order_by("-id").first())
    if latest is None:
        return None
    return latest.duplicate_of if latest.duplicate_of_id else latest


# Calls a cumulative rule counts: done, under way, or still to be decided.
COUNTED_STATUSES = [S.PROPOSED, S.AWAITING_APPROVAL, S.READY, S.RUNNING, S.SUCCEEDED, S.UNKNOWN]


def _scope_key(run, tool: Tool, clause: Cumulative, arguments: dict) -> str | None:
    """The ``PolicyLock`` key of ``clause``'s scope for this call; None if its target is missing."""
    if clause.scope == "run":
        scope = f"run:{run.pk}"
    elif clause.scope == "user":
        scope = f"user:{run.requested_by_id}"
    else:
        target = arguments.get(tool.target_key)
        if target is None or isinstance(target, (dict, list)):
            return None
        scope = "target:" + json.dumps(canonical_value(target))
    key = f"{tool.name}/{scope}"
    return key if len(key) <= 100 else hashlib.sha256(key.encode()).hexdigest()


def _earlier_arguments(run, tool: Tool, clause: Cumulative, arguments: dict) -> list[dict]:
    """Arguments of the counted calls of ``tool`` in ``clause``'s scope and window (this call not yet stored)."""
    # A re-proposal of an action (``duplicate_of``) is the same action: counted once, as its original.
    calls = ToolCall.objects.filter(name=tool.name, status__in=COUNTED_STATUSES, duplicate_of__isnull=True)
    if clause.scope == "run":
        calls = calls.filter(run_id=run.pk)
    elif clause.scope == "user":
        calls = calls.filter(run__requested_by_id=run.requested_by_id)
    else:
        calls = calls.filter(**{f"arguments__{tool.target_key}": arguments[tool.target_key]})
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
        for a in assessments if a.outcome == "make_ready"
        for clause in cumulative_clauses(a.rule)
    } - {None}
    if not keys:
        return
    PolicyLock.objects.bulk_create([PolicyLock(key=key) for key in sorted(keys)], ignore_conflicts=True)
    list(PolicyLock.objects.select_for_update().filter(key__in=keys).order_by("key").values_list("pk"))


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
    if assessment.outcome != "make_ready" or not cumulative_clauses(assessment.rule):
        return assessment
    if not _asks_with_history(run, assessment.tool, assessment.rule, assessment.arguments):
        return assessment
    return dataclasses.replace(assessment, outcome="request_approval",
                               reason=f"approval rule: {assessment.rule} (counting earlier calls)")


def _loosened(run, assessment: Assessment) -> bool:
    """Whether a call goes ahead unapproved only because a granted agent rule replaced the tool's.

    Call before the call is stored (it must not count itself).
    """
    tool = assessment.tool
    return (assessment.outcome == "make_ready" and bool(assessment.granted_by)
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
    with transaction.atomic():
        _lock_cumulative_scopes(run, assessments)
        for index, (call, assessment) in enumerate(zip(calls, assessments, strict=True)):
            assessment = _judge_with_history(run, assessment)
            loosened = _loosened(run, assessment)
            raw = call.get("arguments")
            tool_call = ToolCall.objects.create(
                run=run, step=step, index=index, provider_call_id=call["id"],
                name=str(call.get("name") or "")[:100],
                raw_arguments=raw if isinstance(raw, str) else json.dumps(raw),
                arguments=assessment.arguments,
                side_effect=bool(assessment.tool and assessment.tool.side_effect),
                action_key=assessment.action_key,
            )
            payload = {"tool_call": tool_call.pk, "name": tool_call.name}
            if call.get("original_id"):
                payload["original_id"] = call["original_id"]
            append_event(run, type="tool_call", actor=actor, reason="proposed", payload=payload, to_status=S.PROPOSED)
            if loosened:
                append_event(run, type="policy", actor=actor, reason="loosened approval rule applied",
                             payload={"tool_call": tool_call.pk, "tool_rule": assessment.tool.approval,
                                      "agent_rule": assessment.rule, "granted_by": assessment.granted_by})
            if assessment.outcome == "duplicate":
                original = assessment.original
                _join(tool_call, created[original] if isinstance(original, int) else original, actor=actor)
            elif assessment.outcome in ("invalidate", "deny"):
                _transition(tool_call, assessment.outcome, actor=actor, error=assessment.reason)
            else:
                _transition(tool_call, assessment.outcome, actor=actor, reason=assessment.reason)
            created.append(tool_call)
    return created


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
    return _transition(tool_call, "settle_as_duplicate", actor=actor,
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


def approve_tool_call(*, tool_call: ToolCall, arguments: dict | None, actor: str) -> ToolCall:
    """Approved by a person: ``awaiting_approval -> ready``, with edited arguments if given.

    Raises ``InvalidInput`` when edited arguments break the tool's schema or
    its precondition (checked again: the approver must not get around it).
    """
    if arguments is not None:
        tool = get_tool(tool_call.name)
        problems = tool.schema_errors(arguments)
        if problems:
            raise InvalidInput("Edited arguments do not match the schema: " + "; ".join(problems))
        denial = tool.precondition and tool.precondition(
            ToolContext(run=tool_call.run, user=tool_call.run.requested_by), arguments
        )
        if denial:
            raise InvalidInput(f"Edited arguments are not allowed: {denial}")
        if tool_call.action_key:  # the action is now what the person approved, not what was proposed
            tool_call.action_key = action_identity(tool_call.run.session_id, tool_call.name, arguments)
    return _transition(tool_call, "make_ready", actor=actor, reason="approved", arguments=arguments)


def reject_tool_call(*, tool_call: ToolCall, comment: str, actor: str) -> ToolCall:
    """Rejected by a person: ``awaiting_approval -> rejected``; the model hears why."""
    error = "A person rejected this call." + (f" Comment: {comment}" if comment else "")
    return _transition(tool_call, "reject", actor=actor, error=error)


def expire_tool_call(*, tool_call: ToolCall, actor: str) -> ToolCall:
    """Nobody decided in time: ``awaiting_approval -> expired``."""
    return _transition(tool_call, "expire", actor=actor)


def cancel_pending_tool_calls(*, run, actor: str) -> None:
    """Cancel every call of ``run`` that has not started (proposed, awaiting approval, ready)."""
    for tool_call in run.tool_calls.filter(status__in=[S.PROPOSED, S.AWAITING_APPROVAL, S.READY]):
        _transition(tool_call, "cancel", actor=actor)


def execute_tool_call(tool_call: ToolCall, *, actor: str = "worker") -> ToolCall:
    """Run a ``ready`` call: commit ``running`` with its idempotency key, call, commit the outcome.

    The tool's precondition is checked again before the first attempt
    (``denied`` if it no longer holds). Outcomes: ``succeeded`` (result stored; a result already stored for
    the same key in this run is reused, not executed again); ``failed``
    (``ToolError``; for read-only tools also after ``max_attempts``
    transient failures); ``ready`` again (a transient failure with
    attempts left, of a read-only tool, or ``ToolUnavailable`` from an
    idempotent one: the caller waits ``retry_delay`` first); ``unknown``
    (any other side-effecting call that timed out, hit a transient error
    or raised something unexpected: never retried blindly).
    """
    tool = get_tool(tool_call.name)
    if tool is None:  # removed from the registry since it was proposed: it cannot be sent (again)
        error = f"The tool {tool_call.name!r} is no longer available."
        if tool_call.attempts and tool_call.side_effect:  # an earlier attempt may have taken effect
            return _transition(tool_call, "mark_unknown", actor=actor, error=error)
        return _transition(tool_call, "deny", actor=actor, reason="tool no longer registered", error=error)
    # The world may have changed since the proposal (or the approval). A
    # call sent again after a crash or an error is the same action under
    # the same key, not a new one: its own earlier effect must not deny it.
    if tool.precondition and tool_call.attempts == 0:
        denial = tool.precondition(ToolContext(run=tool_call.run, user=tool_call.run.requested_by,
                                               tool_call=tool_call), tool_call.arguments)
        if denial:
            return _transition(tool_call, "deny", actor=actor, reason="precondition checked before running",
                               error=denial)
    session_id = tool_call.run.session_id
    key = tool_call.idempotency_key or derive_idempotency_key(session_id, tool_call.name, tool_call.arguments)
    _transition(tool_call, "begin", actor=actor, idempotency_key=key, now=timezone.now())
    earlier = (  # an effect already done in the session is reused; reads are always done afresh
        ToolCall.objects.filter(run__session_id=session_id, idempotency_key=key, status=S.SUCCEEDED)
        .exclude(pk=tool_call.pk)
        .first()
    )
    if earlier is not None and tool.side_effect:
        return _transition(tool_call, "succeed", actor=actor, reason=f"reused result of call {earlier.pk}",
                           result=earlier.result, now=timezone.now())
    context = ToolContext(run=tool_call.run, user=tool_call.run.requested_by, idempotency_key=key,
                          timeout_s=tool.timeout_s, tool_call=tool_call)
    failpoint("tool_call_started", tool_call.name, f"agent={tool_call.run.agent.slug}")
    try:
        result = tool.handler(context, tool_call.arguments)
        failpoint("tool_call_returned", tool_call.name)
    except (ToolTimeout, ToolUnavailable) as exc:
        # Sending again is safe for read-only tools, and after an explicit
        # error answer for tools whose external system deduplicates by key.
        may_retry = not tool.side_effect or (tool.idempotent and isinstance(exc, ToolUnavailable))
        if may_retry and tool_call.attempts < tool.max_attempts:
            return _transition(tool_call, "requeue", actor=actor, reason="retrying", error=str(exc))
        if tool.side_effect:
            return _transition(tool_call, "mark_unknown", actor=actor, error=f"{type(exc).__name__}: {exc}")
        return _transition(tool_call, "fail", actor=actor, now=timezone.now(),
                           error=f"Gave up after {tool_call.attempts} attempts: {exc}")
    except ToolError as exc:
        return _transition(tool_call, "fail", actor=actor, error=str(exc), now=timezone.now())
    except Exception as exc:
        log.exception("tool %s raised", tool_call.name)  # the details stay in the log
        error = f"The tool failed unexpectedly ({type(exc).__name__})."
        if tool.side_effect:
            return _transition(tool_call, "mark_unknown", actor=actor, error=error)
        return _transition(tool_call, "fail", actor=actor, error=error, now=timezone.now())
    return _store_result(tool_call, tool, result, actor=actor)


def _store_result(tool_call: ToolCall, tool: Tool, result, *, actor: str) -> ToolCall:
    """Record a handler's return value: ``succeeded``, unless the value cannot be stored.

    A value that is not strict JSON (``Decimal``, NaN, a NUL character) or
    that the database refuses is a deterministic error, never retried: a
    side-effecting call becomes ``unknown`` (its effect may well have
    happened; reconciliation finds out), a read-only one ``failed``.
    """
    try:
        text = json.dumps(result, allow_nan=False)
        if "\\u0000" in text:
            raise ValueError("the result contains a NUL character")
        return _transition(tool_call, "succeed", actor=actor, result=result, now=timezone.now())
    except (TypeError, ValueError, DataError, IntegrityError) as exc:
        log.warning("tool %s returned a result that cannot be stored: %s", tool_call.name, exc)
        tool_call.refresh_from_db()
        error = f"The tool returned a result that cannot be stored ({type(exc).__name__})."
        if tool.side_effect:
            return _transition(tool_call, "mark_unknown", actor=actor, error=error)
        return _transition(tool_call, "fail", actor=actor, error=error, now=timezone.now())


def retry_delay(tool_call: ToolCall) -> float:
    """Seconds to wait before the next attempt: full jitter on ``backoff_s * 2**(attempts-1)``.

    Source: "Exponential Backoff And Jitter", AWS Architecture Blog (2015).
    """
    tool = get_tool(tool_call.name)
    return random.uniform(0, tool.backoff_s * 2 ** max(tool_call.attempts - 1, 0))


def recover_orphaned_call(tool_call: ToolCall, *, actor: str, spare_attempts: bool = False) -> ToolCall:
    """A call found ``running`` by a worker that just took the run's lease (its caller died).

    Read-only and idempotent tools are sent again (``ready``, same key)
    while ``attempts < max_attempts`` -- attempts count the sends cut off by
    crashes too. Past that, a read-only call fails and a side-effecting one
    becomes ``unknown`` (reconciliation), like any other side-effecting call.
    ``spare_attempts``: the death was another run's doing (a bystander), so
    a resendable call is sent again whatever its attempts (the run's
    ``loss_streak`` bounds that).
    """
    tool = get_tool(tool_call.name)
    resendable = tool is not None and (not tool.side_effect or tool.idempotent)
    if resendable and (spare_attempts or tool_call.attempts < tool.max_attempts):
        return _transition(tool_call, "requeue", actor=actor, reason="retrying after a worker crash",
                           error="The worker running this call stopped; sending it again.")
    if not tool_call.side_effect:
        return _transition(tool_call, "fail", actor=actor, reason="worker crashed during every attempt",
                           error=f"The worker stopped during each of {tool_call.attempts} attempts.",
                           now=timezone.now())
    return _transition(tool_call, "mark_unknown", actor=actor, reason="worker crashed during the call",
                       error=f"The worker stopped during this call (attempt {tool_call.attempts}); "
                             "its outcome is unknown.")


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
        sent = tool_call.attempts > 0
        if tool_call.status == S.RUNNING and not tool_call.side_effect:
            _transition(tool_call, "fail", actor=actor, error="The run ended while this call was in flight.", now=now)
        elif sent and tool_call.side_effect:
            _transition(tool_call, "mark_unknown", actor=actor, reason="run ended with the call in flight",
                        error=f"The run ended after {tool_call.attempts} attempt(s); whether it took effect "
                              "is unknown.")
        elif sent:
            _transition(tool_call, "cancel", actor=actor,
                        error=f"The run ended before attempt {tool_call.attempts + 1}; earlier attempts failed.")
        else:
            _transition(tool_call, "cancel", actor=actor)
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


def reconcile_unknown_call(tool_call: ToolCall, *, actor: str) -> str:
    """Ask the tool's ``reconcile`` hook about an ``unknown`` call.

    Returns ``"settled"`` (the hook said ``succeeded`` or ``failed``: the
    call is now too), ``"later"`` (no trace yet, or the external system
    could not be asked: try again after ``reconcile_delay``) or
    ``"person"`` (the tool has no hook, or ``RECONCILE_MAX_TRIES`` tries
    found nothing: only a person can settle it). A hook that raises counts
    as a try that learned nothing; nothing is ever guessed.
    """
    tool = get_tool(tool_call.name)
    if tool is None or tool.reconcile is None:
        return "person"
    ToolCall.objects.filter(pk=tool_call.pk).update(reconcile_attempts=F("reconcile_attempts") + 1)
    tool_call.refresh_from_db()
    try:
        found = tool.reconcile(tool_call.idempotency_key)
    except Exception as exc:
        log.warning("reconcile hook of %s raised: %s", tool_call.name, exc)
        found = Reconciliation("not_found", error=f"{type(exc).__name__}: {exc}")
    if found.status == "succeeded":
        _transition(tool_call, "succeed", actor=actor, reason="reconciled automatically",
                    result=found.result, now=timezone.now())
        return "settled"
    if found.status == "failed":
        _transition(tool_call, "fail", actor=actor, reason="reconciled automatically",
                    error=found.error or "The external system reports that the call failed.", now=timezone.now())
        return "settled"
    with transaction.atomic():
        append_event(tool_call.run, type="reconciliation", actor=actor, reason=found.error or "not found yet",
                     payload={"tool_call": tool_call.pk, "try": tool_call.reconcile_attempts})
    if tool_call.reconcile_attempts >= settings.TOLLGATE["RECONCILE_MAX_TRIES"]:
        return "person"
    return "later"


def reconcile_delay(tool_call: ToolCall) -> float:
    """Seconds before the next automatic reconciliation try (doubling from RECONCILE_BACKOFF_S)."""
    return settings.TOLLGATE["RECONCILE_BACKOFF_S"] * 2 ** max(tool_call.reconcile_attempts - 1, 0)


def settle_unknown_call(*, tool_call: ToolCall, succeeded: bool, result, evidence: str, actor: str) -> ToolCall:
    """A person reconciled an ``unknown`` call: ``succeeded`` with ``result``, or ``failed``; evidence kept."""
    if succeeded:
        return _transition(tool_call, "succeed", actor=actor, reason=f"reconciled by a person: {evidence}",
                           result=result, now=timezone.now())
    return _transition(tool_call, "fail", actor=actor, reason=f"reconciled by a person: {evidence}",
                       error=f"Reconciled as failed: {evidence}", now=timezone.now())


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
        proposed, _ = _parse_arguments(tool_call.raw_arguments)
        if proposed != edited:
            note.update(proposed_arguments=proposed, approved_arguments=edited)
    return note
