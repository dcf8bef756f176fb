"""A call's arguments: read strictly from the model's text, written one canonical way, and the
identity of the action they describe (the key that links re-proposals, and the idempotency key's base).
"""

import hashlib
import json
import logging
from decimal import Decimal

from runs.base.model_output import UnsafeArguments, parse_arguments
from tools.registry import ToolContext

log = logging.getLogger(__name__)

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


def action_identity(tool, run, arguments: dict) -> str:
    """The business identity of one action (``Tool.same_action``): 64 hex digits of sha256, the same under any ``tool_call_id``.

    Over the session (``"session"``) or run (``"run"``), the tool and the canonical arguments, or the tool and the key a
    function returns for ``(ToolContext(run, requester), arguments)``. Raises ``TypeError`` when that key is not a non-empty
    string, and whatever the function raises.
    """
    if tool.same_action == "session":
        return _digest(str(run.session_id), tool.name, _canonical_json(arguments))
    if tool.same_action == "run":
        return _digest(f"run {run.pk}", tool.name, _canonical_json(arguments))
    key = tool.same_action(ToolContext(run=run, user=run.requested_by), arguments)
    if not isinstance(key, str) or not key:
        raise TypeError(f"the business key of {tool.name} must be a non-empty string, not {key!r}")
    return _digest("key", tool.name, key)


def checked_action_identity(tool, run, arguments: dict) -> tuple[str, str]:
    """``(action identity, "")``, or ``("", why the arguments are invalid)`` when the tool's business key
    function (``Tool.same_action``) fails on them: whatever it raises is logged with its details, and the
    caller gets a message that shows none of them (a model or a person may read it)."""
    try:
        return action_identity(tool, run, arguments), ""
    except Exception as exc:
        log.exception("the business key of %s could not be computed", tool.name)
        return "", f"The action's business key could not be computed from these arguments ({type(exc).__name__})."


def same_action_scope(tool, run) -> dict:
    """Lookup arguments (``ToolCall.objects.filter(**...)``) for the calls that may be the same action as one of
    ``tool`` in ``run`` (``Tool.same_action``): the session's, the run's, or every call of the tool."""
    if tool.same_action == "session":
        return {"run__session_id": run.session_id}
    if tool.same_action == "run":
        return {"run_id": run.pk}
    return {"name": tool.name}


def idempotency_key_base(tool, run, arguments: dict, *, identity: str = "") -> str:
    """The idempotency key of ``tool(arguments)`` in ``run`` before any failure, at most 80 characters; no query.

    ``"<tool>-s<session>-<hex>"`` (``-r<run>-`` for ``same_action="run"``, ``-k-`` for a business key); ``<hex>``: 32 hex
    digits of ``identity`` or ``action_identity``. The key sent appends ``-<n>`` after ``n`` definite failures (docs/design.md#outcomes).
    """
    scope = {"session": f"s{run.session_id}", "run": f"r{run.pk}"}.get(tool.same_action, "k")
    return f"{tool.name[:30]}-{scope}-{(identity or action_identity(tool, run, arguments))[:32]}"


def parse_raw_arguments(raw) -> tuple[dict | None, str]:
    """(arguments, error): parse a raw arguments string strictly (``runs.base.model_output.parse_arguments``)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, ""
    if not isinstance(raw, str):  # screened responses carry text; anything else is re-read as text
        raw = json.dumps(raw, allow_nan=True, default=str)
    try:
        return parse_arguments(raw), ""
    except UnsafeArguments as exc:
        return None, str(exc)
