"""Approval rules: decide, from the arguments alone, whether a human must approve.

A rule is ``"always"``, ``"never"`` or ``"<argument> <op> <number>"`` with
``op`` one of ``> >= < <= == !=``, e.g. ``"amount > 50"``. Rules are data
in agent configs, so they are parsed, never evaluated as code.
"""

import operator
import re
from decimal import Decimal, InvalidOperation

_OPS = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
_CONDITION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?)\s*$")


class InvalidRule(ValueError):
    """An approval rule that is not ``always``, ``never`` or a valid condition."""


def check_rule(rule: str) -> None:
    """Raise ``InvalidRule`` unless ``rule`` is well-formed."""
    if rule not in ("always", "never") and not _CONDITION.match(rule or ""):
        raise InvalidRule(f"Approval rule {rule!r} is not 'always', 'never' or '<argument> <op> <number>'.")


def approval_required(rule: str, arguments: dict) -> bool:
    """Whether ``rule`` asks for approval of a call with ``arguments``.

    A condition whose argument is missing or not a number asks for
    approval: when in doubt, a person decides. Raises ``InvalidRule``.
    """
    check_rule(rule)
    if rule in ("always", "never"):
        return rule == "always"
    name, op, literal = _CONDITION.match(rule).groups()
    try:
        value = Decimal(str(arguments[name]))
    except (KeyError, InvalidOperation, TypeError):
        return True
    return _OPS[op](value, Decimal(literal))
