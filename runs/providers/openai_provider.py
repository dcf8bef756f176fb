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

Calls are async (``openai.AsyncOpenAI`` over the SDK's aiohttp transport;
clients per event loop, see ``runs.providers.sdk_calls.SDKClientCache``)
and make one attempt: the SDK does not retry. The request body is built
here as plain JSON and the answer read as decoded JSON
(``sdk_calls.post_json``), each field checked for its type
(``sdk_calls.json_field``). An error status raises ``ModelError`` with the status
and the SDK's error class, ``transient`` for 408/409/429/5xx with
``retry_after_s`` from ``Retry-After`` / ``retry-after-ms``; a timeout or
an unreachable server raises a transient ``ModelError``; a connection lost
mid-answer ``StreamInterrupted``. A body or stream that cannot be
understood raises ``MalformedResponse``.
"""

import openai

from runs.base.model_call import MalformedResponse, ModelRequest, ModelResponse, Provider
from runs.providers.http_config import config_problems, normalise_finish_reason, parse_config
from runs.providers.sdk_calls import SDKClientCache, json_field, post_json, read_interruptible, sdk_call

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
    each connect, read and pool wait of a call (``SDKClientCache``);
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
                params.update(stream=True, stream_options={"include_usage": True})
                stream = await post_json(client, "/chat/completions", params, stream=True, sdk=openai)
                return await read_interruptible(_read_stream, stream, request, sdk=openai)
            return _read_completion(await post_json(client, "/chat/completions", params, stream=False, sdk=openai))

        return await sdk_call(call, provider="OpenAI", sdk=openai, cfg=cfg)


def _read_completion(body) -> ModelResponse:
    """A non-streamed ``chat.completion`` (decoded JSON) -> ``ModelResponse``."""
    choices = json_field(body, "choices", list, None) if isinstance(body, dict) else None
    if not choices:
        raise MalformedResponse("Malformed OpenAI response: no choices in the body.")
    message = json_field(choices[0], "message", dict)
    calls = []
    for call in json_field(message, "tool_calls", list, ()):
        function = json_field(call, "function", dict)
        calls.append({"id": json_field(call, "id", str, ""), "name": json_field(function, "name", str, ""),
                      "arguments": json_field(function, "arguments", str, "")})
    return ModelResponse(
        content=json_field(message, "content", str, ""),
        tool_calls=calls,
        finish_reason=_finish_reason(json_field(choices[0], "finish_reason", str, None), calls),
        **_usage(json_field(body, "usage", dict, None)),
    )


def _usage(usage: dict | None) -> dict:
    """``input_tokens`` / ``output_tokens`` of a decoded ``usage`` object (0 when there is none)."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": json_field(usage, "prompt_tokens", int, 0),
            "output_tokens": json_field(usage, "completion_tokens", int, 0)}


async def _read_stream(stream, request: ModelRequest) -> ModelResponse:
    """Accumulate ``chat.completion.chunk`` events (decoded JSON), reporting deltas as they arrive.

    Tool calls arrive as fragments keyed by ``index``: the first carries
    ``id`` and ``function.name``, later ones ``function.arguments`` pieces.
    A stream that ends before any ``finish_reason`` was half-received:
    ``MalformedResponse``.
    """
    text, calls, finish, usage = [], {}, None, None
    async with stream:
        async for chunk in stream:
            usage = json_field(chunk, "usage", dict, usage)
            for choice in json_field(chunk, "choices", list, ()):
                delta = json_field(choice, "delta", dict, {})
                content = json_field(delta, "content", str, "")
                if content:
                    text.append(content)
                    request.emit("text_delta", {"text": content})
                for part in json_field(delta, "tool_calls", list, ()):
                    index = _position(part, calls)
                    call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    function = json_field(part, "function", dict, {})
                    call["id"] = json_field(part, "id", str, "") or call["id"]
                    if not call["name"]:
                        call["name"] = json_field(function, "name", str, "")
                    fragment = json_field(function, "arguments", str, "")
                    call["arguments"] += fragment
                    request.emit("tool_call_delta", {"index": index, "id": call["id"],
                                                     "name": call["name"], "arguments": fragment})
                finish = json_field(choice, "finish_reason", str, None) or finish
    if finish is None:
        raise MalformedResponse("Malformed OpenAI stream: it ended without a finish_reason.")
    tool_calls = [calls[i] for i in sorted(calls)]
    return ModelResponse(
        content="".join(text),
        tool_calls=tool_calls,
        finish_reason=_finish_reason(finish, tool_calls),
        **_usage(usage),
    )


def _position(part: dict, calls: dict[int, dict]) -> int:
    """Which call a streamed ``tool_calls`` fragment belongs to: its ``index``; without one (compatible servers
    that send each call whole), a new call when it carries an id other than the last call's, else the last call."""
    index = json_field(part, "index", int, None)
    if index is not None:
        return index
    if not calls:
        return 0
    last = max(calls)
    given = json_field(part, "id", str, "")
    return last + 1 if given and calls[last]["id"] and given != calls[last]["id"] else last


def _finish_reason(reason: str | None, calls: list[dict]) -> str:
    return normalise_finish_reason(reason, FINISH_REASONS, calls)


_CLIENTS = SDKClientCache(openai.AsyncOpenAI, openai.DefaultAioHttpClient)


PROVIDER = Provider(name="openai", config_problems=config_problems, client=OpenAIClient)
