"""The ``anthropic`` provider: the Messages API with tools, through the ``anthropic`` SDK.

Config keys: see ``runs.providers.http_config`` (``max_output_tokens`` is
required by the API; it defaults to ``TOLLGATE["DEFAULT_MAX_OUTPUT_TOKENS"]``).

Wire mapping of the provider-neutral messages:

* instructions -> the top-level ``system`` parameter;
* ``user`` -> a ``user`` text block; ``system`` (runtime feedback) -> a
  ``user`` text block prefixed ``[runtime]`` (Messages has no system role
  inside the conversation);
* ``assistant`` -> a text block (if any text) and one ``tool_use`` block
  per call; raw arguments that are not a JSON object are sent as
  ``input: {}`` (the tool result already tells the model they were bad);
* ``tool`` -> a ``tool_result`` block in a ``user`` message,
  ``is_error`` when the result's status is not ``succeeded``;
* consecutive messages of the same role are merged into one (the API
  requires alternation), with ``tool_result`` blocks first; empty text
  blocks are dropped; a conversation must start with ``user``.

Finish reasons: ``end_turn``/``stop_sequence``/``pause_turn``/``refusal``
-> ``stop``, ``tool_use`` -> ``tool_calls``, ``max_tokens`` -> ``length``.
Usage: input = ``input_tokens`` + cache creation + cache read tokens.
Calls are async (``anthropic.AsyncAnthropic`` over the SDK's aiohttp
transport), one attempt each, with a plain JSON body and the answer read
as decoded JSON; errors as in ``runs.providers.openai_provider``.
"""

import json
import re

import anthropic
from django.conf import settings

from runs.base.model_output import UnsafeArguments, parse_arguments
from runs.base.model_call import MalformedResponse, ModelRequest, ModelResponse, Provider
from runs.providers.http_config import config_problems, normalise_finish_reason, parse_config
from runs.providers.sdk_calls import SDKClientCache, json_field, post_json, read_interruptible, sdk_call

RUNTIME_PREFIX = "[runtime] "
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "refusal": "stop",
                "tool_use": "tool_calls", "max_tokens": "length", "model_context_window_exceeded": "length"}
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _input_object(raw) -> dict:
    """The ``input`` of a ``tool_use`` block replayed from history: the raw arguments if they parse
    strictly (``runs.base.model_output.parse_arguments``), else ``{}`` (the call was ``invalid``; its result says why)."""
    if isinstance(raw, dict):
        return raw
    try:
        return parse_arguments(raw or "{}")
    except UnsafeArguments:
        return {}


def _blocks(message: dict) -> tuple[str, list[dict]]:
    """(wire role, content blocks) of one neutral message."""
    role, content = message["role"], message.get("content") or ""
    if role == "assistant":
        blocks = [{"type": "text", "text": content}] if content.strip() else []
        for call in message.get("tool_calls") or []:
            name = call["name"] if NAME_PATTERN.match(call.get("name") or "") else "invalid_tool_name"
            blocks.append({"type": "tool_use", "id": call["id"], "name": name,
                           "input": _input_object(call.get("arguments"))})
        return "assistant", blocks
    if role == "tool":
        try:
            failed = json.loads(content).get("status") != "succeeded"
        except (ValueError, AttributeError):
            failed = False
        block = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": content}
        if failed:
            block["is_error"] = True
        return "user", [block]
    text = RUNTIME_PREFIX + content if role == "system" else content
    return "user", [{"type": "text", "text": text}] if text.strip() else []


def to_anthropic_messages(messages: list[dict]) -> list[dict]:
    """The Messages ``messages`` for a neutral history (see the module docstring)."""
    out: list[dict] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for message in out:
        if message["role"] == "user":
            message["content"].sort(key=lambda b: b["type"] != "tool_result")  # stable: results first
    if not out or out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": RUNTIME_PREFIX + "(conversation start)"}]})
    return out


def to_anthropic_tools(tools: list[dict]) -> list[dict]:
    """``[{"name", "description", "input_schema"}]``."""
    return [{"name": t["name"], "description": t.get("description", ""), "input_schema": t["parameters"]}
            for t in tools]


class AnthropicClient:
    """One agent's Anthropic Messages endpoint.

    ``timeout_s``: the config's ``timeout_s`` (seconds), what the SDK allows
    each connect, read and pool wait of a call (``SDKClientCache``);
    ``max_retries``: the config's, how often the engine tries a transiently
    failed call again (``runs.engine.loop``). Raises ``ConfigError`` for an unusable config.
    """

    name = "anthropic"

    def __init__(self, config: dict):
        self.config = parse_config(config, default_key_env="ANTHROPIC_API_KEY")
        self.timeout_s = self.config.timeout_s
        self.max_retries = self.config.max_retries

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One Messages call. Raises ``ModelError`` / ``StreamInterrupted`` / ``MalformedResponse``."""
        cfg = self.config
        client = _CLIENTS.get(cfg)
        params = {
            "model": cfg.model,
            "messages": to_anthropic_messages(request.messages),
            "max_tokens": cfg.max_output_tokens or settings.TOLLGATE["DEFAULT_MAX_OUTPUT_TOKENS"],
        }
        if request.instructions:
            params["system"] = request.instructions
        if request.tools:
            params["tools"] = to_anthropic_tools(request.tools)
        if cfg.temperature is not None:
            params["temperature"] = cfg.temperature

        async def call():
            if cfg.stream:
                params["stream"] = True
                stream = await post_json(client, "/v1/messages", params, stream=True, sdk=anthropic)
                return await read_interruptible(_read_stream, stream, request, sdk=anthropic)
            return _read_message(await post_json(client, "/v1/messages", params, stream=False, sdk=anthropic))

        return await sdk_call(call, provider="Anthropic", sdk=anthropic, cfg=cfg)


def _input_tokens(usage: dict) -> int:
    return sum(json_field(usage, name, int, 0)
               for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))


def _read_message(body) -> ModelResponse:
    """A non-streamed ``message`` (decoded JSON) -> ``ModelResponse``."""
    content = json_field(body, "content", list, None) if isinstance(body, dict) else None
    if content is None:
        raise MalformedResponse("Malformed Anthropic response: no content in the body.")
    text, calls = [], []
    for block in content:
        kind = json_field(block, "type", str)
        if kind == "text":
            text.append(json_field(block, "text", str, ""))
        elif kind == "tool_use":
            calls.append({"id": json_field(block, "id", str, ""), "name": json_field(block, "name", str, ""),
                          "arguments": json.dumps(json_field(block, "input", dict, {}))})
    usage = json_field(body, "usage", dict, {})
    return ModelResponse(
        content="".join(text),
        tool_calls=calls,
        finish_reason=_finish_reason(json_field(body, "stop_reason", str, None), calls),
        input_tokens=_input_tokens(usage),
        output_tokens=json_field(usage, "output_tokens", int, 0),
    )


async def _read_stream(stream, request: ModelRequest) -> ModelResponse:
    """Accumulate Messages stream events (decoded JSON), reporting deltas as they arrive.

    ``message_start`` carries input usage; ``content_block_start`` opens a
    text or ``tool_use`` block (id, name); ``content_block_delta`` adds
    ``text_delta`` text or ``input_json_delta`` argument fragments;
    ``message_delta`` carries ``stop_reason`` and the cumulative output
    usage. A stream without ``message_stop`` was half-received:
    ``MalformedResponse``.
    """
    text, blocks, stop_reason, stopped = [], {}, None, False
    input_tokens = output_tokens = 0
    async with stream:
        async for event in stream:
            kind = json_field(event, "type", str)
            if kind == "message_start":
                usage = json_field(json_field(event, "message", dict), "usage", dict, {})
                input_tokens = _input_tokens(usage)
                output_tokens = json_field(usage, "output_tokens", int, 0)
            elif kind == "content_block_start":
                block = json_field(event, "content_block", dict)
                if json_field(block, "type", str) == "tool_use":
                    index = json_field(event, "index", int)
                    call = blocks[index] = {"id": json_field(block, "id", str, ""),
                                            "name": json_field(block, "name", str, ""), "arguments": ""}
                    request.emit("tool_call_delta", {"index": index, "id": call["id"], "name": call["name"],
                                                     "arguments": ""})
            elif kind == "content_block_delta":
                delta = json_field(event, "delta", dict)
                delta_kind = json_field(delta, "type", str)
                if delta_kind == "text_delta":
                    piece = json_field(delta, "text", str, "")
                    text.append(piece)
                    request.emit("text_delta", {"text": piece})
                elif delta_kind == "input_json_delta" and (index := json_field(event, "index", int)) in blocks:
                    call, piece = blocks[index], json_field(delta, "partial_json", str, "")
                    call["arguments"] += piece
                    request.emit("tool_call_delta", {"index": index, "id": call["id"], "name": call["name"],
                                                     "arguments": piece})
            elif kind == "message_delta":
                stop_reason = json_field(json_field(event, "delta", dict, {}), "stop_reason", str, None) or stop_reason
                usage = json_field(event, "usage", dict, {})
                output_tokens = max(output_tokens, json_field(usage, "output_tokens", int, 0))
                if json_field(usage, "input_tokens", int, None) is not None:
                    input_tokens = max(input_tokens, _input_tokens(usage))
            elif kind == "message_stop":
                stopped = True
    if not stopped:
        raise MalformedResponse("Malformed Anthropic stream: it ended without message_stop.")
    calls = [blocks[i] for i in sorted(blocks)]
    for call in calls:
        call["arguments"] = call["arguments"] or "{}"
    return ModelResponse(
        content="".join(text),
        tool_calls=calls,
        finish_reason=_finish_reason(stop_reason, calls),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def _finish_reason(reason: str | None, calls: list[dict]) -> str:
    return normalise_finish_reason(reason, STOP_REASONS, calls)


_CLIENTS = SDKClientCache(anthropic.AsyncAnthropic, anthropic.DefaultAioHttpClient)


PROVIDER = Provider(name="anthropic", config_problems=config_problems, client=AnthropicClient)
