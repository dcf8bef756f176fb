"""What a person (or the clock) decides about a call awaiting approval: approved, rejected, expired."""

from runs.errors import InvalidInput
from runs.transitions import apply
from runs.tx import RunTx
from tools.models import ToolCall
from tools.registry import ToolContext, get_tool
from tools.services.arguments import action_identity


def approve_tool_call(tx: RunTx, tool_call: ToolCall, *, arguments: dict | None, actor: str) -> ToolCall:
    """Approved by a person: ``awaiting_approval -> ready``, with edited arguments if given; returns the call.

    ``tool_call``: a call of ``tx.run``, loaded with that instance as its
    run. Raises ``InvalidInput`` when edited arguments break the tool's
    schema or its precondition (checked again: the approver must not get
    around it), and what ``RunTx.apply`` raises.
    """
    action_key = ""
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
            action_key = action_identity(tool, tool_call.run, arguments)
    return tx.apply(tool_call.make_ready, actor=actor, reason="approved", arguments=arguments, action_key=action_key)


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
