"""Completion checks: code, not the model, decides whether a run is done.

A check gets the run after the model gave a final answer and returns a
``Verdict``. Agents name their check in ``Agent.completion_check``; checks
are registered in code like tools (the demo's are in ``tools.demo``).
"""

from dataclasses import dataclass
from typing import Callable

from runs.models import Outcome


@dataclass(frozen=True)
class Verdict:
    """``complete`` with an ``outcome`` (achieved / not_achieved), or not, with a ``reason``."""

    complete: bool
    outcome: str = ""
    reason: str = ""


def achieved() -> Verdict:
    return Verdict(True, Outcome.ACHIEVED)


def not_achieved(reason: str = "") -> Verdict:
    return Verdict(True, Outcome.NOT_ACHIEVED, reason)


def incomplete(reason: str) -> Verdict:
    return Verdict(False, reason=reason)


_CHECKS: dict[str, Callable] = {}


def register_check(name: str):
    """Decorator: register ``fn(run) -> Verdict`` as completion check ``name``."""

    def decorate(fn):
        _CHECKS[name] = fn
        return fn

    return decorate


def check_names() -> list[str]:
    """Names of every registered check, sorted."""
    return sorted(_CHECKS)


def evaluate(run) -> Verdict:
    """Run the agent's completion check on ``run``. Raises ``KeyError`` for an unknown check."""
    return _CHECKS[run.agent.completion_check](run)


@register_check("default")
def no_pending_tool_calls(run) -> Verdict:
    """Complete (achieved) once no tool call of the run still owes a result."""
    from tools.models.tool_call import PENDING_STATUSES

    pending = run.tool_calls.filter(status__in=PENDING_STATUSES).count()
    if pending:
        return incomplete(f"{pending} tool call(s) have not finished.")
    return achieved()
