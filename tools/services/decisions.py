"""What a person (or the clock) decides about a call awaiting approval: approved, rejected, expired."""

from runs.base.awaiting import drive
from runs.base.errors import InvalidInput
from runs.transitions import apply
from runs.tx import RunTx
from tools.models import ToolCall
from tools.registry import ToolContext, get_tool
from tools.services.arguments import checked_action_identity
from tools.services.execution import check_precondition
from tools.services.targets import target_key


def check_edited_arguments(tool_call: ToolCall, arguments: dict) -> str:
    """Check arguments a person edited before approving ``tool_call``; returns the action identity they give
    (``""`` when the call has none: a read-only tool's).

    Call it before taking the run's lock: the precondition may do I/O (it is
    asked as the engine asks it, ``check_precondition``: sync or ``async
    def``, and one that raises or times out denies the edit, the first
    time: the person may try again), and the
    business key function is the integrator's code. Raises
    ``InvalidInput`` when the edit breaks the tool's schema, its
    precondition (checked again: the approver must not get around it) or
    its business key function (``Tool.same_action``), and when the tool is
    not available now (``get_tool`` finds none).
    """
    tool = get_tool(tool_call.name)
    if tool is None:  # removed from the registry, or an MCP tool held for an operator: nothing to check against
        raise InvalidInput(f"The tool {tool_call.name!r} is not available now; edited arguments cannot be checked.")
    problems = tool.schema_errors(arguments)
    if problems:
        raise InvalidInput("Edited arguments do not match the schema: " + "; ".join(problems))
    # As the engine asks it (a sync or ``async def`` precondition, fail-safe, within the tool's timeout), but
    # once: a transient failure refuses the edit rather than holding the person's request for retries.
    denial = tool.precondition and drive(check_precondition(
        tool, ToolContext(run=tool_call.run, user=tool_call.run.requested_by), arguments, tries=1))
    if denial:
        raise InvalidInput(f"Edited arguments are not allowed: {denial}")
    if not tool_call.action_key:
        return ""
    action_key, problem = checked_action_identity(tool, tool_call.run, arguments)
    if problem:
        raise InvalidInput(f"Edited arguments are not allowed: {problem}")
    return action_key


def approve_tool_call(tx: RunTx, tool_call: ToolCall, *, arguments: dict | None, action_key: str = "",
                      actor: str) -> ToolCall:
    """Approved by a person: ``awaiting_approval -> ready``; returns the call (of ``tx.run``, loaded with it as its run).

    ``arguments``: the person's edit checked by ``check_edited_arguments`` (its answer is ``action_key``), None: as
    proposed. Raises what ``RunTx.apply`` raises.
    """
    target = target_key(get_tool(tool_call.name), arguments) if arguments is not None else ""
    return tx.apply(tool_call.make_ready, actor=actor, reason="approved", arguments=arguments, action_key=action_key,
                    target=target)


def reject_tool_call(tx: RunTx, tool_call: ToolCall, *, comment: str, actor: str) -> ToolCall:
    """Rejected by a person: ``awaiting_approval -> rejected``; the model hears why. ``tool_call``: a call
    of ``tx.run``, loaded with that instance as its run. Raises what ``RunTx.apply`` raises."""
    error = "A person rejected this call." + (f" Comment: {comment}" if comment else "")
    return tx.apply(tool_call.reject, actor=actor, error=error)


def expire_tool_call(*, tool_call: ToolCall, actor: str) -> ToolCall:
    """Nobody decided in time: ``awaiting_approval -> expired``.

    Only the sweeper calls it, in a transaction that any error aborts
    whole: no savepoint (``runs.transitions.apply``).
    """
    return apply(tool_call.expire, actor=actor, savepoint=False)
