"""The provider-neutral request and response of one model call."""

from dataclasses import dataclass, field
from typing import Protocol


class ModelError(Exception):
    """The provider could not produce a response (the run fails with model_error)."""


class ConfigError(ValueError):
    """An agent's model config is not usable (unknown provider, missing key)."""


@dataclass
class ModelRequest:
    """What one model call sends.

    ``messages``: ``[{"role", "content", "tool_calls"?, "tool_call_id"?}]``
    in the order of ``runs.models.Message``; ``tools``: tool definitions
    (``{"name", "description", "parameters"}``); ``turn_index``: the
    number of model calls this run has already made.
    """

    instructions: str
    messages: list[dict]
    tools: list[dict]
    turn_index: int
    run_id: int


@dataclass
class ModelResponse:
    """What one model call returned.

    ``tool_calls``: ``[{"id", "name", "arguments": raw string}]``;
    ``finish_reason``: ``stop``, ``tool_calls`` or ``length`` (output cut off).
    """

    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str = "stop"
    input_tokens: int = 0
    output_tokens: int = 0

    def as_dict(self) -> dict:
        return {
            "content": self.content,
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }


class ModelClient(Protocol):
    """A provider: ``complete(request) -> ModelResponse``; raises ``ModelError``."""

    def complete(self, request: ModelRequest) -> ModelResponse: ...


def get_client(config: dict) -> ModelClient:
    """The client for an agent's ``model`` config. Raises ``ConfigError``."""
    from runs.providers.scripted import ScriptedClient

    providers = {"scripted": ScriptedClient}
    name = (config or {}).get("provider", "scripted")
    if name not in providers:
        raise ConfigError(f"Unknown model provider {name!r}; known: {', '.join(sorted(providers))}.")
    return providers[name](config)
