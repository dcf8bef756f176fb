"""The ``openai`` provider: Chat Completions with tools, through the ``openai`` SDK.

Works with any OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM)
through an endpoint profile. Config keys: see ``runs.providers.http_config``.

Wire mapping of the provider-neutral messages (``ModelRequest.messages``):

* instructions -> a leading ``system`` message;
* ``user`` -> ``user``; ``assistant`` -> ``assistant`` with ``tool_calls``
  ``[{"id", "type": "function", "function": {"name", "arguments"}}]``
  (``arguments`` is the raw string the model produced, sent back verbatim);
* ``tool`` -> ``tool`` with ``tool_call_id``;
* ``system`` (runtime feedback in the history) -> ``user`` text prefixed
  ``[runtime]``: several compatible servers reject a system message that
  is not the first one.

Calls are async (``openai.AsyncOpenAI``; clients per event loop, see
``runs.providers.http_config.SDKClientCache``) and make one attempt: the
SDK does not retry. An error status raises ``ModelError`` with the status
and the SDK's error class, ``transient`` for 408/409/429/5xx with
``retry_after_s`` from ``Retry-After`` / ``retry-after-ms``; a timeout or
an unreachable server raises a transient ``ModelError``; a connection lost
mid-answer ``StreamInterrupted``. A body or stream that cannot be
understood raises ``MalformedResponse``.
"""

import openai

from runs.base.model_call import MalformedResponse, ModelRequest, ModelResponse, Provider
from runs.providers.http_config import (
    SDKClientCache,
    config_problems,
    normalise_finish_reason,
    parse_config,
    read_interruptible,
    sdk_call,
)

RUNTIME_PREFIX = "[runtime] "
FINISH_REASONS = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls",
                  "length": "length", "content_filter": "stop"}


def to_openai_messages(instructions: str, messages: list[dict]) -> list[dict]:
    """The Chat Completions ``messages`` for a neutral history."""
    out = [{"role": "system", "content": instructions}] if instructions else []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant":
            wire = {"role": "assistant", "content": content or None}
            if message.get("tool_calls"):
                wire["tool_calls"] = [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": c.get("arguments") or ""}}
                    for c in message["tool_calls"]
                ]
            out.append(wire)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": message["tool_call_id"], "content": content})
        elif role == "system":
            out.append({"role": "user", "content": RUNTIME_PREFIX + content})
        else:
            out.append({"role": "user", "content": content})
    return out


def to_openai_tools(tools: list[dict]) -> list[dict]:
    """``[{"type": "function", "function": {"name", "description", "parameters"}}]``."""
    return [{"type": "function", "function": dict(tool)} for tool in tools]


class OpenAIClient:
    """One agent's OpenAI-compatible endpoint.

    ``timeout_s``: the config's ``timeout_s`` (seconds), what the SDK allows
    each connect, write, read and pool wait of a call (``SDKClientCache``);
    ``max_retries``: the config's, how often the engine tries a transiently
    failed call again (``runs.engine.loop``). Raises ``ConfigError`` for an unusable config.
    """

    name = "openai"

    def __init__(self, config: dict):
        self.config = parse_config(config, default_key_env="OPENAI_API_KEY")
        self.timeout_s = self.config.timeout_s
        self.max_retries = self.config.max_retries

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One Chat Completions call. Raises ``ModelError`` / ``StreamInterrupted`` / ``MalformedResponse``."""
        cfg = self.config
        client = _CLIENTS.get(cfg)
        params = {"model": cfg.model, "messages": to_openai_messages(request.instructions, request.messages)}
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
        if cfg.temperature is not None:
            params["temperature"] = cfg.temperature
        if cfg.max_output_tokens is not None:
            params["max_completion_tokens"] = cfg.max_output_tokens

        async def call():
            if cfg.stream:
                stream = await client.chat.completions.create(
                    **params, stream=True, stream_options={"include_usage": True})
                return await read_interruptible(_read_stream, stream, request, sdk=openai)
            return _read_completion(await client.chat.completions.create(**params))

        return await sdk_call(call, provider="OpenAI", sdk=openai, cfg=cfg)


def _read_completion(completion) -> ModelResponse:
    """A non-streamed ``chat.completion`` -> ``ModelResponse``."""
    if isinstance(completion, str) or not getattr(completion, "choices", None):
        raise MalformedResponse("Malformed OpenAI response: no choices in the body.")
    choice = completion.choices[0]
    message = choice.message
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments or ""}
             for c in (message.tool_calls or [])]
    usage = completion.usage
    return ModelResponse(
        content=message.content or "",
        tool_calls=calls,
        finish_reason=_finish_reason(choice.finish_reason, calls),
        input_tokens=usage.prompt_tokens if usage else 0,
        output_tokens=usage.completion_tokens if usage else 0,
    )


async def _read_stream(stream, request: ModelRequest) -> ModelResponse:
    """Accumulate ``chat.completion.chunk`` events, reporting deltas as they arrive.

    Tool calls arrive as fragments keyed by ``index``: the first carries
    ``id`` and ``function.name``, later ones ``function.arguments`` pieces.
    A stream that ends before any ``finish_reason`` was half-received:
    ``MalformedResponse``.
    """
    text, calls, finish, usage = [], {}, None, None
    async with stream:
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices or []:
                delta = choice.delta
                if delta is not None and delta.content:
                    text.append(delta.content)
                    request.emit("text_delta", {"text": delta.content})
                for part in (delta.tool_calls or []) if delta is not None else []:
                    call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                    fn = part.function
                    call["id"] = part.id or call["id"]
                    if fn is not None and fn.name and not call["name"]:
                        call["name"] = fn.name
                    fragment = (fn.arguments or "") if fn else ""
                    call["arguments"] += fragment
                    request.emit("tool_call_delta", {"index": part.index, "id": call["id"],
                                                     "name": call["name"], "arguments": fragment})
                if choice.finish_reason:
                    finish = choice.finish_reason
    if finish is None:
        raise MalformedResponse("Malformed OpenAI stream: it ended without a finish_reason.")
    tool_calls = [calls[i] for i in sorted(calls)]
    return ModelResponse(
        content="".join(text),
        tool_calls=tool_calls,
        finish_reason=_finish_reason(finish, tool_calls),
        input_tokens=usage.prompt_tokens if usage else 0,
        output_tokens=usage.completion_tokens if usage else 0,
    )


def _finish_reason(reason: str | None, calls: list[dict]) -> str:
    return normalise_finish_reason(reason, FINISH_REASONS, calls)


_CLIENTS = SDKClientCache(openai.AsyncOpenAI)


PROVIDER = Provider(name="openai", config_problems=config_problems, client=OpenAIClient)
