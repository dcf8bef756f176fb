"""A call's arguments: read strictly from the model's text, written one canonical way, and the
identity of the action they describe (the key that links re-proposals, and the idempotency key's base).
"""

import hashlib
import json
from decimal import Decimal

from runs.model_output import UnsafeArguments, parse_arguments


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


def idempotency_key_base(session_id: int, name: str, arguments: dict) -> str:
    """The idempotency key of ``name(arguments)`` in a session before any failure: ``"<tool>-s<session>-<hex>"``.

    ``<hex>``: the first 32 hex digits of ``action_identity``; at most 80
    characters. The same action executed again (a re-send after a crash, a
    re-proposal, a follow-up run) gets the same key, so it takes effect at
    most once. For a tool whose calls are deduplicated by key (side-effecting
    or ``idempotent``) the key sent is this base followed by ``-<n>`` when
    ``n`` earlier calls of the session definitely failed under it, so that a
    fresh attempt after a failure is not answered with the stored failure
    (``tools.services.execution``; no query here).
    """
    return f"{name[:30]}-s{session_id}-{action_identity(session_id, name, arguments)[:32]}"


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
