"""Assessing a model turn's proposed calls: schema, precondition, approval rule, same action.

Nothing here writes: ``assess_tool_calls`` decides, outside any transaction
(preconditions may do I/O), and ``tools.services.proposal`` records.
"""

from dataclasses import dataclass
from enum import StrEnum

from runs.base import selects
from runs.base.awaiting import Steps
from tools.models import ToolCall
from tools.models.tool_call import NO_EFFECT_STATUSES
from tools.policy import approval_required, combine
from tools.registry import Tool, ToolContext, tools_for_agent
from tools.services.arguments import checked_action_identity, parse_raw_arguments, same_action_scope
from tools.services.execution import check_precondition


class Assessed(StrEnum):
    """What happens to a proposed call: the ``ToolCall`` transition of that name, or ``DUPLICATE``."""

    INVALIDATE = "invalidate"
    DENY = "deny"
    REQUEST_APPROVAL = "request_approval"
    MAKE_READY = "make_ready"
    DUPLICATE = "duplicate"  # it repeats an action that succeeded or is still pending: linked to that call


# Outcomes whose call stands for its action (a later call of the same action is its duplicate).
STANDS_FOR_ITS_ACTION = frozenset({Assessed.DUPLICATE, Assessed.REQUEST_APPROVAL, Assessed.MAKE_READY})


@dataclass(frozen=True)
class Assessment:
    """What the policy decided for one proposed call, before anything is written.

    ``outcome``: an ``Assessed`` (``DUPLICATE``: ``original`` is the earlier ``ToolCall`` or an index in this turn);
    ``reason``: the error or the rule that applied; ``action_key``: the business identity of a side-effecting call;
    ``rule``, ``granted_by``: as ``effective_rule`` returns them.
    """

    arguments: dict | None
    outcome: Assessed
    reason: str
    tool: Tool | None = None
    action_key: str = ""
    original: "ToolCall | int | None" = None
    rule: str = ""
    granted_by: str = ""


def effective_rule(agent, tool: Tool) -> tuple[str, str]:
    """``(rule, granted_by)``: the approval rule for ``tool`` in ``agent``'s runs (docs/design.md#agent-rules-tighten-only).

    The agent's rule is added to the tool's, or replaces it when a holder of ``runs.loosen_approval_policy`` saved it
    (``granted_by``: that user's name, else "").
    """
    agent_rule = agent.approval_policy.get(tool.name)
    grantor = agent.approval_policy_granted_by
    if agent_rule is not None and grantor is not None:
        return agent_rule, grantor.get_username()
    return combine(tool.approval, agent_rule), ""


def assess_tool_calls(*, run, calls: list[dict], truncated: bool, stop_at=None) -> Steps:
    """Decide what happens to each call of one model turn; writes nothing. A step (``runs.base.awaiting``)
    that returns the ``Assessment`` of each call, in order.

    ``calls`` is ``[{"id", "name", "arguments": str | dict}]`` as the
    provider returned them; ``truncated`` is True when the output was cut
    off (``finish_reason=length``). Unknown tool, unparsable, truncated or
    schema-breaking arguments -> ``invalidate``; a failed precondition ->
    ``deny``; else the approval rule decides. Preconditions may do I/O
    (the refund asks the gateway: ``execution.check_precondition``; one that
    raises or hangs denies), so call this
    outside any transaction. ``stop_at``: the run's deadline (an aware
    datetime, or None), past which a precondition still running is cut
    short (``runs.base.awaiting.Interrupted``).
    """
    allowed = {tool.name: tool for tool in tools_for_agent(run.agent)}
    assessments: list[Assessment] = []
    for call in calls:
        name = str(call.get("name") or "")
        tool = allowed.get(name)
        arguments, error = parse_raw_arguments(call.get("arguments"))
        if truncated:
            arguments, error = None, "The output was cut off (finish_reason=length); the arguments are incomplete."
        elif call.get("refused"):
            error = call["refused"]
        key = ""
        if tool and tool.side_effect and not error:
            key, error = checked_action_identity(tool, run, arguments)
        original = _same_action(run, tool, key, assessments) if key else None
        if original is not None:
            assessments.append(Assessment(arguments, Assessed.DUPLICATE, "", tool, action_key=key, original=original))
            continue
        if tool is None and not error:
            error = f"Unknown tool {name!r}. Available tools: {', '.join(sorted(allowed))}."
        elif arguments is not None and not error:
            problems = tool.schema_errors(arguments)
            if problems:
                error = "Arguments do not match the schema: " + "; ".join(problems)
        if error:
            assessments.append(Assessment(arguments, Assessed.INVALIDATE, error, tool, action_key=key))
            continue
        denial = None
        if tool.precondition:
            denial = yield from check_precondition(tool, ToolContext(run=run, user=run.requested_by), arguments,
                                                   stop_at=stop_at)
        if denial:
            assessments.append(Assessment(arguments, Assessed.DENY, denial, tool, action_key=key))
            continue
        rule, granted_by = effective_rule(run.agent, tool)
        outcome = Assessed.REQUEST_APPROVAL if approval_required(rule, arguments) else Assessed.MAKE_READY
        assessments.append(Assessment(arguments, outcome, f"approval rule: {rule}", tool, action_key=key, rule=rule,
                                      granted_by=granted_by))
    return assessments


def _same_action(run, tool, key: str, earlier_in_turn: list[Assessment]) -> "ToolCall | int | None":
    """The call that already stands for action ``key``: earlier in this turn, or earlier in the session.

    Only an original that succeeded or is still pending counts; an action
    that ended without effect may be proposed (and assessed) afresh.
    """
    for index, assessment in enumerate(earlier_in_turn):
        if assessment.action_key == key and assessment.outcome in STANDS_FOR_ITS_ACTION:
            return assessment.original if assessment.outcome == Assessed.DUPLICATE else index
    found = selects.select(ToolCall, {"action_key": key, **same_action_scope(tool, run)},
                           exclude={"status__in": NO_EFFECT_STATUSES}, order_by="-id", limit=1)
    if not found:
        return None
    latest = found[0]
    return latest.duplicate_of if latest.duplicate_of_id else latest
