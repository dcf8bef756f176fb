"""What an approver changed: the proposed arguments of a call against the approved ones, leaf by leaf.

The one place that says what an edit was. The inbox item's resolve event
carries its result (``approvals.models.Interrupt.event_payload``), and the
API and the pages show it as "proposed → approved" per changed field.
"""

from tools.services.arguments import parse_raw_arguments

_MISSING = object()


def proposed_arguments(tool_call) -> dict | None:
    """The arguments the model proposed for ``tool_call`` (what was assessed and shown), parsed again from ``raw_arguments``.

    None if they never parsed; ``ToolCall.arguments`` holds the approved ones once a person edited them.
    """
    arguments, _error = parse_raw_arguments(tool_call.raw_arguments)
    return arguments


def _pointer(path: tuple) -> str:
    """``path`` (keys and list indexes) as a JSON Pointer (RFC 6901: ``~`` → ``~0``, ``/`` → ``~1``)."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _field(path: tuple) -> str:
    """``path`` for people: keys joined by dots, list indexes in brackets (``items[2].qty``)."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _same_leaf(proposed, approved) -> bool:
    """Equal scalars; ``True`` and ``1`` (or ``False`` and ``0``) differ, ``80`` and ``80.0`` do not."""
    return isinstance(proposed, bool) == isinstance(approved, bool) and proposed == approved


def _walk(proposed, approved, path: tuple, changes: list[dict]) -> None:
    if isinstance(proposed, dict) and isinstance(approved, dict):
        for key in [*proposed, *(k for k in approved if k not in proposed)]:
            _walk(proposed.get(key, _MISSING), approved.get(key, _MISSING), (*path, key), changes)
        return
    if isinstance(proposed, list) and isinstance(approved, list):
        for index in range(max(len(proposed), len(approved))):
            _walk(proposed[index] if index < len(proposed) else _MISSING,
                  approved[index] if index < len(approved) else _MISSING, (*path, index), changes)
        return
    if proposed is _MISSING and approved is _MISSING:
        return
    if proposed is not _MISSING and approved is not _MISSING and _same_leaf(proposed, approved):
        return
    change = {"path": _pointer(path), "field": _field(path)}
    if proposed is _MISSING:
        change.update(change="added", approved=approved)
    elif approved is _MISSING:
        change.update(change="removed", proposed=proposed)
    else:
        change.update(change="changed", proposed=proposed, approved=approved)
    changes.append(change)


def argument_changes(proposed: dict | None, approved: dict | None) -> list[dict]:
    """Each changed leaf between ``proposed`` and ``approved`` arguments, in the proposed order (``approved`` None: ``[]``); pure.

    ``[{"path", "field", "change", "proposed"?, "approved"?}]``: ``path`` a JSON Pointer (RFC 6901, ``/items/0/qty``), ``field``
    for people (``items[0].qty``), ``change`` ``changed``/``added``/``removed``; objects by key, lists by index.
    """
    if approved is None:
        return []
    changes: list[dict] = []
    _walk(proposed if proposed is not None else {}, approved, (), changes)
    return changes
