"""The provider-neutral request and response of one model call, and what a provider declares."""

from dataclasses import dataclass, field
from typing import Callable, Protocol


class ModelError(Exception):
    """The provider could not produce a response (the run fails with model_error).

    ``str(error)`` names what failed (e.g. the HTTP status and the SDK's
    error class); ``status`` is the HTTP status the model server answered
    with (``None`` when it did not answer); ``detail`` is the server's own
    message (the ``message`` of its error body, or its text), truncated,
    with credentials masked (``runs.providers.sdk_calls.server_message``).
    ``readable()`` joins them: what the failed step and the run keep and
    whoever may read the run reads (docs/design.md#model-errors).

    ``transient``: the same request may well succeed later (a connection
    refused or broken, a timeout, HTTP 408, 409, 429 or 5xx); providers
    never retry themselves, the caller decides. ``retry_after_s``: the
    seconds the server asked to wait before trying again (``Retry-After`` /
    ``retry-after-ms``; 0 or more), ``None`` when it did not say.
    """

    def __init__(self, message: str = "", *, detail: str = "", status: int | None = None, transient: bool = False,
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.detail = detail
        self.status = status
        self.transient = transient
        self.retry_after_s = retry_after_s

    def readable(self) -> str:
        """The message, then what the server said if it said anything: ``OpenAI API error 400 (BadRequestError):
        Invalid 'messages[1]'.``"""
        return f"{self}: {self.detail}" if self.detail else str(self)

    def server_answer(self) -> dict | None:
        """``{"status", "message"}`` of the model server's error answer, or ``None`` when no answer came."""
        if self.status is None:
            return None
        return {"status": self.status, "message": self.detail}


class StreamInterrupted(ModelError):
    """The connection broke off in the middle of a response (half an answer); raised ``transient``.

    The loop discards the half-received step and asks again, within budget.
    """


class MalformedResponse(ModelError):
    """The provider answered, but the body or stream could not be understood (a JSON body that does not parse,
    a stream without its final event); the loop treats it as invalid model output (a repair turn), so the run
    ends ``invalid_model_output`` once the repair turns are spent."""


class ConfigError(ValueError):
    """An agent's model config is not usable (unknown provider, missing key)."""


@dataclass
class ModelRequest:
    """What one model call sends.

    ``messages``: ``[{"role", "content", "tool_calls"?, "tool_call_id"?}]``
    in the order of ``runs.models.Message``; ``tools``: tool definitions
    (``{"name", "description", "parameters"}``); ``turn_index``: the
    number of model calls this run has already made; ``on_delta(kind,
    data)``: called while a response streams in, with ``kind``
    ``text_delta`` (``{"text"}``) or ``tool_call_delta`` (``{"index",
    "id", "name", "arguments"}`` — ``arguments`` is the new fragment);
    it must not raise and never affects the result.
    """

    instructions: str
    messages: list[dict]
    tools: list[dict]
    turn_index: int
    run_id: int
    on_delta: Callable[[str, dict], None] | None = None

    def emit(self, kind: str, data: dict) -> None:
        """Pass one streaming event to ``on_delta`` if there is one."""
        if self.on_delta is not None:
            self.on_delta(kind, data)


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
    """A provider's client for one run's calls (docs/design.md#model-providers).

    ``await complete(request) -> ModelResponse``: one attempt, on the caller's event loop. Raises ``ModelError``
    (``StreamInterrupted``, ``MalformedResponse``). ``timeout_s``: seconds per call (HTTP providers: per connect/write/read wait).
    """

    timeout_s: float

    async def complete(self, request: ModelRequest) -> ModelResponse: ...


@dataclass(frozen=True)
class Provider:
    """What a provider module declares as its ``PROVIDER`` (``runs.providers.registry``; docs/design.md#model-providers).

    ``name``: an agent's ``model["provider"]``; ``config_problems(config)``: what is wrong with a ``model`` dict, without the
    environment (``[]``: usable); ``client(config)``: the ``ModelClient`` (may raise ``ConfigError``).
    """

    name: str
    config_problems: Callable[[dict], list[str]]
    client: Callable[[dict], ModelClient]
