"""Approval rules: decide whether a human must approve a proposed call.

A rule is one or more clauses joined by ``or``; approval is needed when
any clause asks for it. A clause is one of:

* ``always`` / ``never``;
* ``<argument> <op> <number>`` with ``op`` one of ``> >= < <= == !=``,
  e.g. ``amount > 50``: decided from this call's arguments alone;
* ``sum(<argument>) per <scope> [within <n><unit>] <op> <number>`` or
  ``count per <scope> [within <n><unit>] <op> <number>`` with ``op``
  ``>`` or ``>=``: a cumulative clause over the calls of the same tool in
  ``scope`` (``run``: this run; ``user``: every run of the requester;
  ``target``: every call naming the same value of the tool's
  ``target_key``) proposed within the window (units ``s m h d``; no
  window: ever), counting this call too. E.g. ``sum(amount) per target
  within 30d > 50``.

Rules are data in agent configs, so they are parsed, never evaluated as
code. Cumulative clauses only grow as calls are added (hence only ``>``
and ``>=``): judged on this call alone they give a lower bound, which is
what ``approval_required`` does without a ``history``.
"""

import operator
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Callable

from django.utils.translation import gettext as _

_OPS = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
_NUMBER = r"(-?\d+(?:\.\d+)?)"
_CONDITION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*" + _NUMBER + r"\s*$")
_CUMULATIVE = re.compile(
    r"^\s*(?:sum\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)|count)\s+per\s+(run|user|target)"
    r"(?:\s+within\s+(\d+)\s*([smhd]))?\s*(>=|>)\s*" + _NUMBER + r"\s*$"
)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SCOPES = ("run", "user", "target")


# Who may let an approval rule ask less often than the tool's own (an agent's policy: runs.engine.agents;
# an MCP tool's operator rule: tools.mcp.discovery).
LOOSEN_PERMISSION = "runs.loosen_approval_policy"


class InvalidRule(ValueError):
    """An approval rule that is not a valid ``or`` of clauses (see the module docstring)."""


@dataclass(frozen=True)
class Threshold:
    """``<argument> <op> <number>`` on this call's arguments."""

    argument: str
    op: str
    limit: Decimal


@dataclass(frozen=True)
class Cumulative:
    """``sum(argument)`` (or a count, when ``argument`` is None) of calls in ``scope`` over ``window_s`` seconds.

    ``window_s`` None: no time limit.
    """

    argument: str | None
    scope: str
    window_s: int | None
    op: str
    limit: Decimal


Clause = bool | Threshold | Cumulative  # a bool is ``always`` (True) or ``never`` (False)


def parse_rule(rule: str) -> tuple[Clause, ...]:
    """The clauses of ``rule``, in order. Raises ``InvalidRule``."""
    if not isinstance(rule, str) or not rule.strip():
        raise InvalidRule(_("Approval rule %(rule)s is empty.") % {"rule": repr(rule)})
    return tuple(_parse_clause(part) for part in re.split(r"\s+or\s+", rule.strip()))


def _parse_clause(text: str) -> Clause:
    if text in ("always", "never"):
        return text == "always"
    if match := _CONDITION.match(text):
        name, op, literal = match.groups()
        return Threshold(name, op, Decimal(literal))
    if match := _CUMULATIVE.match(text):
        argument, scope, amount, unit, op, literal = match.groups()
        window_s = int(amount) * _UNIT_SECONDS[unit] if amount else None
        return Cumulative(argument, scope, window_s, op, Decimal(literal))
    raise InvalidRule(_(
        "Approval clause %(clause)s is not 'always', 'never', '<argument> <op> <number>' or "
        "'sum(<argument>)|count per run|user|target [within <n>s|m|h|d] >|>= <number>'."
    ) % {"clause": repr(text)})


def check_rule(rule: str, *, target_key: str = "") -> None:
    """Raise ``InvalidRule`` unless ``rule`` is well-formed for a tool with ``target_key``.

    A ``per target`` clause needs the tool to declare a ``target_key``.
    """
    for clause in parse_rule(rule):
        if isinstance(clause, Cumulative) and clause.scope == "target" and not target_key:
            raise InvalidRule(_("Approval rule %(rule)s counts 'per target', but the tool declares no target key.")
                              % {"rule": repr(rule)})


def asks_as_often(rule: str, than: str) -> bool:
    """Whether the valid rule ``rule`` certainly asks for approval whenever the valid rule ``than`` does: it holds
    ``always``, or every clause of ``than`` but ``never`` (clauses compared as parsed, so spacing does not
    matter). Conservative: False for a rule that asks as often in other words (``x > 5`` than ``x > 9``).
    Raises ``InvalidRule`` for an invalid rule."""
    clauses = set(parse_rule(rule))
    return True in clauses or set(parse_rule(than)) - {False} <= clauses


def cumulative_clauses(rule: str) -> list[Cumulative]:
    """The cumulative clauses of ``rule`` (they need the call history); none for an empty rule.

    Raises ``InvalidRule``.
    """
    if not rule:
        return []
    return [clause for clause in parse_rule(rule) if isinstance(clause, Cumulative)]


def combine(tool_rule: str, agent_rule: str | None) -> str:
    """A rule asking for approval whenever ``tool_rule`` or ``agent_rule`` does (``agent_rule`` None: the tool's)."""
    if agent_rule is None or agent_rule == tool_rule:
        return tool_rule
    return f"{tool_rule} or {agent_rule}"


def approval_required(
    rule: str, arguments: dict, history: Callable[[Cumulative], list[dict]] | None = None
) -> bool:
    """Whether ``rule`` asks for approval of a call with ``arguments``.

    ``history(clause)`` returns the arguments of the earlier calls the
    cumulative ``clause`` counts (this call excluded); without it, a
    cumulative clause is judged on this call alone (a lower bound). A
    clause whose argument is missing or not a finite number asks for
    approval: when in doubt, a person decides. Raises ``InvalidRule``.
    """
    for clause in parse_rule(rule):
        if isinstance(clause, bool):
            asks = clause
        elif isinstance(clause, Threshold):
            value = _number(arguments, clause.argument)
            asks = value is None or _OPS[clause.op](value, clause.limit)
        else:
            asks = _cumulative_asks(clause, arguments, history(clause) if history else [])
        if asks:
            return True
    return False


def _cumulative_asks(clause: Cumulative, arguments: dict, earlier: list[dict]) -> bool:
    if clause.argument is None:
        total = Decimal(len(earlier) + 1)
    else:
        values = [_number(args, clause.argument) for args in [*earlier, arguments]]
        if any(value is None for value in values):
            return True
        total = sum(values, Decimal(0))
    return _OPS[clause.op](total, clause.limit)


def _number(arguments, name: str) -> Decimal | None:
    """``arguments[name]`` as a finite ``Decimal``, or None (missing, not a number, not finite)."""
    try:
        value = arguments[name]
        if isinstance(value, bool):
            return None
        number = Decimal(str(value))
    except (KeyError, TypeError, InvalidOperation):
        return None
    return number if number.is_finite() else None
