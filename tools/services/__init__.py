"""Tool calls: validate, apply policy, execute, and report the result.

Every ``ToolCall`` state change happens in these modules, through
``runs.transitions.apply``, and is recorded as a run event of type
``tool_call``. The model's text has no say: validity is the JSON Schema,
permission is the precondition and the approval rule, and a call that needs
approval runs only after ``approvals.services`` says so.

One job per module; the names imported here are what the layers above use:

* ``arguments``: strict parsing, canonical form, action identity, idempotency keys;
* ``assessment``: what the policy decides for each proposed call (writes nothing);
* ``proposal``: recording the calls of a turn, cumulative rules under lock, re-proposals;
* ``decisions``: approved, rejected or expired by the inbox;
* ``edits``: what an approver changed, proposed → approved per leaf;
* ``execution``: running a ready call, retries, calls left in flight by a dead worker;
* ``reconciliation``: unknown outcomes, by the tool's hook or a person;
* ``results``: result messages for the model, and no call left in flight when a run ends.
"""

from tools.services.arguments import action_identity, canonical_value, idempotency_key_base
from tools.services.assessment import assess_tool_calls
from tools.services.decisions import approve_tool_call, check_edited_arguments, expire_tool_call, reject_tool_call
from tools.services.execution import charged_attempts, execute_tool_call, recover_orphaned_call, retry_delay
from tools.services.proposal import propose_tool_calls, settle_joined_calls
from tools.services.reconciliation import Reconciled, reconcile_delay, reconcile_unknown_call, settle_unknown_call
from tools.services.results import (
    deliver_tool_results,
    settle_calls_at_run_end,
    tool_result_content,
    tool_result_messages,
    unknown_calls_for_a_person,
)

__all__ = [
    "action_identity",
    "approve_tool_call",
    "assess_tool_calls",
    "canonical_value",
    "charged_attempts",
    "check_edited_arguments",
    "deliver_tool_results",
    "execute_tool_call",
    "expire_tool_call",
    "idempotency_key_base",
    "propose_tool_calls",
    "Reconciled",
    "reconcile_delay",
    "reconcile_unknown_call",
    "recover_orphaned_call",
    "reject_tool_call",
    "retry_delay",
    "settle_calls_at_run_end",
    "settle_joined_calls",
    "settle_unknown_call",
    "tool_result_content",
    "tool_result_messages",
    "unknown_calls_for_a_person",
]
