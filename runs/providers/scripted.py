"""The ``scripted`` provider: a deterministic model for demos and tests.

Config: ``{"provider": "scripted", "turns": [turn, ...]}`` where a turn is
``{"content": str}`` (a final answer), ``{"tool_calls": [{"name": str,
"arguments": object | raw JSON string}, ...]}``, or both, optionally with
``"finish_reason": "length"`` (output cut off) and ``"usage":
{"input_tokens", "output_tokens"}``. Turn ``i`` answers the run's ``i``-th
model call, so a resumed or recovered run continues where it was.
"""

import json

from django.utils.translation import gettext as _, gettext_noop

from runs.providers.base import ConfigError, ModelError, ModelRequest, ModelResponse, Provider

NEEDS_TURNS = gettext_noop("A scripted model config needs a list of 'turns'.")


def config_problems(config: dict) -> list[str]:
    """Problems with a scripted ``config``: ``turns`` must be a list of objects whose ``content`` is a
    string and whose ``tool_calls`` is a list of objects. Empty list: usable."""
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
    return errors


class ScriptedClient:
    """Plays back ``config["turns"]`` by the run's model-call index."""

    def __init__(self, config: dict):
        turns = config.get("turns")
        if not isinstance(turns, list):
            raise ConfigError(NEEDS_TURNS)
        self.turns = turns

    def complete(self, request: ModelRequest) -> ModelResponse:
        if request.turn_index >= len(self.turns):
            raise ModelError(f"The scripted model has no turn {request.turn_index + 1} (it has {len(self.turns)}).")
        turn = self.turns[request.turn_index]
        calls = []
        for i, call in enumerate(turn.get("tool_calls") or []):
            arguments = call.get("arguments", {})
            calls.append({
                "id": call.get("id") or f"call_{request.run_id}_{request.turn_index}_{i}",
                "name": call.get("name", ""),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            })
        usage = turn.get("usage") or {}
        default_reason = "tool_calls" if calls else "stop"
        return ModelResponse(
            content=turn.get("content") or "",
            tool_calls=calls,
            finish_reason=turn.get("finish_reason", default_reason),
            input_tokens=int(usage.get("input_tokens", sum(len(m.get("content") or "") for m in request.messages) // 4)),
            output_tokens=int(usage.get("output_tokens", len(json.dumps(turn)) // 4)),
        )


PROVIDER = Provider(name="scripted", config_problems=config_problems, client=ScriptedClient)
