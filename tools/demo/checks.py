"""The demo shop's completion checks (registered by ``tools.demo.apps.DemoConfig.ready``).

Each judges a run of one demo agent from its tool calls, within the floor
every agent gets (``runs.engine.completion``).
"""

from runs.base import selects
from runs.engine.completion import Verdict, achieved, incomplete, not_achieved
from tools.models import ToolCall, ToolCallStatus

S = ToolCallStatus


def _calls(run, name: str, *statuses) -> list[ToolCall]:
    """The run's calls of tool ``name`` in one of ``statuses`` (one statement, ``runs.base.selects``)."""
    return selects.select(ToolCall, {"run": run.pk, "name": name, "status__in": statuses})


def refund_done(run) -> Verdict:
    """Achieved if a refund succeeded; not achieved if one was rejected or refused."""
    if _calls(run, "refund", S.SUCCEEDED):
        return achieved()
    if _calls(run, "refund", S.REJECTED, S.DENIED, S.EXPIRED):
        return not_achieved("The refund was rejected or the order is not refundable.")
    return incomplete("No refund has been issued: call the refund tool, or explain why the order is not refundable.")


def cancel_done(run) -> Verdict:
    """Achieved if the order was cancelled; not achieved if that was rejected or refused."""
    if _calls(run, "cancel_order", S.SUCCEEDED):
        return achieved()
    if _calls(run, "cancel_order", S.REJECTED, S.DENIED, S.EXPIRED):
        return not_achieved("The cancellation was rejected or the order cannot be cancelled.")
    return incomplete("The order has not been cancelled: no cancel_order call succeeded.")


def email_done(run) -> Verdict:
    """Achieved if send_email succeeded; not achieved if rejected or the legal check failed."""
    if _calls(run, "send_email", S.SUCCEEDED):
        return achieved()
    if _calls(run, "send_email", S.REJECTED, S.EXPIRED):
        return not_achieved("Sending the email was rejected.")
    failed_legal = [c for c in _calls(run, "legal_check", S.SUCCEEDED) if (c.result or {}).get("approved") is False]
    if failed_legal:
        return not_achieved("The legal check did not approve the text.")
    return incomplete("The email has not been sent: no send_email call succeeded.")


# Check name (an agent's ``completion_check``) -> check.
CHECKS = {"refund": refund_done, "cancel_order": cancel_done, "send_email": email_done}
