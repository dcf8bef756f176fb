"""The ``scripted`` provider: a deterministic model for demos and tests.

Config: ``{"provider": "scripted", "turns": [turn, ...]}`` where a turn is
``{"content": str}`` (a final answer), ``{"tool_calls": [{"name": str,
"arguments": object | raw JSON string}, ...]}``, or both, optionally with
``"finish_reason": "length"`` (output cut off) and ``"usage":
{"input_tokens", "output_tokens"}``. Turn ``i`` answers the run's ``i``-th
model call, so a resumed or recovered run continues where it was.

A turn may also say what to answer after each way the last tool call
ended: ``"content_by_status": {status: str}``. The status is the one in the
last tool result the model sees (``tools.services.results``: ``succeeded``,
``rejected``, ``denied``, ``failed``, ...), or ``edited`` for a call that
succeeded with arguments an approver changed (``succeeded`` when
``edited`` is not given). A status not listed, or no tool result, gives
``content``. In the chosen text, ``{path}`` is replaced by that value of
the tool result, e.g. ``{result.amount}`` or ``{error}`` (dots go into
objects); a path the result does not have (or holds null) stays as it is. E.g.
``{"content": "Done.", "content_by_status": {"succeeded": "Refunded
{result.amount}.", "rejected": "The refund was not approved."}}``.

A tool call given its arguments as an object may take a top-level value
from the last tool result the same way: a string that is one placeholder
and nothing else (``{"order_id": "{result.order_id}"}``) becomes that
value, with its JSON type (here a number); a path the result does not
have stays as written (and the tool's schema will likely refuse it).
"""

import json
import re

from django.conf import settings
from django.utils.translation import gettext as _, gettext_noop

from runs.base.model_call import ConfigError, ModelError, ModelRequest, ModelResponse, Provider

NEEDS_TURNS = gettext_noop("A scripted model config needs a list of 'turns'.")
EDITED = "edited"
# Statuses a tool result can carry (``tools.services.results``), and ``edited``.
RESULT_STATUSES = ("succeeded", EDITED, "invalid", "denied", "rejected", "expired", "cancelled", "failed",
                   "unknown", "pending")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\}")


def config_problems(config: dict) -> list[str]:
    """Problems with a scripted ``config``: ``turns`` must be a list of objects whose ``content`` is a
    string, whose ``tool_calls`` is a list of objects and whose ``content_by_status`` maps statuses of
    ``RESULT_STATUSES`` to strings. Empty list: usable."""
    turns = config.get("turns")
    if not isinstance(turns, list):
        return [_(NEEDS_TURNS)]
    errors = []
    for number, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            errors.append(_("Turn %(number)s must be an object.") % {"number": number})
        elif not isinstance(turn.get("content", ""), str):
            errors.append(_("Turn %(number)s: 'content' must be a string.") % {"number": number})
        elif not isinstance(turn.get("tool_calls", []), list) or not all(
            isinstance(call, dict) for call in turn.get("tool_calls", [])
        ):
            errors.append(_("Turn %(number)s: 'tool_calls' must be a list of objects.") % {"number": number})
        else:
            errors += _content_by_status_problems(turn.get("content_by_status", {}), number)
    return errors


def _content_by_status_problems(by_status, number: int) -> list[str]:
    if not isinstance(by_status, dict) or not all(isinstance(text, str) for text in by_status.values()):
        return [_("Turn %(number)s: 'content_by_status' must be an object of strings.") % {"number": number}]
    unknown = sorted(status for status in by_status if status not in RESULT_STATUSES)
    if unknown:
        return [_("Turn %(number)s: 'content_by_status' has unknown statuses %(unknown)s; known: %(known)s.")
                % {"number": number, "unknown": ", ".join(unknown), "known": ", ".join(RESULT_STATUSES)}]
    return []


def _last_tool_result(messages: list[dict]) -> dict:
    """The JSON body of the last tool result in ``messages`` ({} without one, or when it is not an object)."""
    for message in reversed(messages):
        if message.get("role") == "tool":
            try:
                body = json.loads(message.get("content") or "")
            except ValueError:
                return {}
            return body if isinstance(body, dict) else {}
    return {}


def _lookup(body: dict, path: str):
    value = body
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _fill(text: str, body: dict) -> str:
    """``text`` with each ``{path}`` replaced by that value of ``body`` (strings as they are, others as JSON)."""
    def value(match):
        found = _lookup(body, match.group(1))
        if found is None:
            return match.group(0)
        return found if isinstance(found, str) else json.dumps(found)

    return PLACEHOLDER.sub(value, text)


def _arguments(arguments, body: dict):
    """Call ``arguments`` (an object, or raw JSON text kept as it is) with each top-level value that is a
    lone ``{path}`` replaced by that value of ``body``, typed (see the module doc)."""
    if not isinstance(arguments, dict):
        return arguments
    filled = {}
    for name, value in arguments.items():
        match = PLACEHOLDER.fullmatch(value) if isinstance(value, str) else None
        found = _lookup(body, match.group(1)) if match else None
        filled[name] = value if found is None else found
    return filled


def _answer(turn: dict, messages: list[dict]) -> str:
    """The turn's text after the last tool result in ``messages`` (see the module doc for ``content_by_status``)."""
    by_status = turn.get("content_by_status") or {}
    body = _last_tool_result(messages)
    status, approval = body.get("status"), body.get("approval")
    if status == "succeeded" and isinstance(approval, dict) and "approved_arguments" in approval and EDITED in by_status:
        status = EDITED
    if isinstance(status, str) and status in by_status:
        return _fill(by_status[status], body)
    return turn.get("content") or ""


class ScriptedClient:
    """Plays back ``config["turns"]`` by the run's model-call index.

    It answers at once, without I/O; ``timeout_s`` is the server's default
    model timeout (``TOLLGATE["MODEL_TIMEOUT_S"]``, seconds), like an HTTP
    provider's with no ``timeout_s`` in its config.
    """

    def __init__(self, config: dict):
        turns = config.get("turns")
        if not isinstance(turns, list):
            raise ConfigError(NEEDS_TURNS)
        self.turns = turns
        self.timeout_s = float(settings.TOLLGATE["MODEL_TIMEOUT_S"])

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The turn ``request.turn_index``. Raises ``ModelError`` (not transient) when there is no such turn."""
        if request.turn_index >= len(self.turns):
            raise ModelError(f"The scripted model has no turn {request.turn_index + 1} (it has {len(self.turns)}).")
        turn = self.turns[request.turn_index]
        calls = []
        last_result = _last_tool_result(request.messages)
        for i, call in enumerate(turn.get("tool_calls") or []):
            arguments = _arguments(call.get("arguments", {}), last_result)
            calls.append({
                "id": call.get("id") or f"call_{request.run_id}_{request.turn_index}_{i}",
                "name": call.get("name", ""),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            })
        usage = turn.get("usage") or {}
        default_reason = "tool_calls" if calls else "stop"
        return ModelResponse(
            content=_answer(turn, request.messages),
            tool_calls=calls,
            finish_reason=turn.get("finish_reason", default_reason),
            input_tokens=int(usage.get("input_tokens", sum(len(m.get("content") or "") for m in request.messages) // 4)),
            output_tokens=int(usage.get("output_tokens", len(json.dumps(turn)) // 4)),
        )


PROVIDER = Provider(name="scripted", config_problems=config_problems, client=ScriptedClient)
