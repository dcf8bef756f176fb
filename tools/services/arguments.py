"""A call's arguments: read strictly from the model's text, written one canonical way, and the
identity of the action they describe (the key that links re-proposals, and the idempotency key).
"""

import hashlib
import json
from decimal import Decimal

from runs.model_output import UnsafeArguments, parse_arguments
from tools.models import ToolCall, ToolCallStatus


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
    failed = ToolCall.objects.filter(run__session_id=session_id, status=ToolCallStatus.FAILED, idempotency_key__startswith=base)
    generation = failed.count()
    return f"{base}-{generation}" if generation else base


def parse_raw_arguments(raw) -> tuple[dict | None, str]:
    """(arguments, error): parse a raw arguments string strictly (``runs.model_output.parse_arguments``)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, ""
    if not isinstance(raw, str):  # screened responses carry text; anything else is re-read as text
        raw = json.dumps(raw, allow_nan=True, default=str)
    try:
        return parse_arguments(raw), ""
    except UnsafeArguments as exc:
        return None, str(exc)
