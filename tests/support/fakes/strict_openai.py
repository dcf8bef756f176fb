"""A ``ReplayServer`` for the OpenAI wire format that refuses what the real Chat Completions API refuses.

``StrictOpenAIServer(script)`` answers like ``ReplayServer("openai", script)``
but first checks each request as the real API does and answers a broken one
with 400 (401 without a key) and OpenAI's error body (``invalid_request_error``, with ``param``),
without using up a script entry. Every refusal is kept in ``violations``, so
a test can assert there were none. Checked (``chat_request_problems``):

* the ``Authorization: Bearer`` header;
* top-level fields: only documented request arguments ("Unrecognized request
  argument supplied"), ``model`` and ``messages`` present, ``stream_options``
  only with ``stream``, not both ``max_tokens`` and ``max_completion_tokens``,
  ``temperature`` within 0..2, ``tool_choice`` only with ``tools``;
* messages: a known ``role``, only that role's fields ("Additional
  properties are not allowed"), string content (``null`` only for an
  assistant message with ``tool_calls``), well-formed ``tool_calls`` whose
  function names match the tools' pattern (offered now or not); every
  assistant ``tool_calls`` followed by one ``tool`` message per id, and no
  ``tool`` message that answers none;
* tools: ``{"type": "function", "function": {"name", "description"?,
  "parameters"?, "strict"?}}``, names of ``[a-zA-Z0-9_-]{1,64}``, unique,
  parameters a JSON Schema object.
"""

import json
import re
import threading

from tests.support.fakes.llm_server import ReplayServer, openai_error

REQUEST_FIELDS = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "n", "stream",
    "stream_options", "stop", "max_tokens", "max_completion_tokens", "presence_penalty", "frequency_penalty",
    "logit_bias", "logprobs", "top_logprobs", "user", "seed", "response_format", "metadata", "store",
    "reasoning_effort", "service_tier", "modalities", "audio", "prediction", "web_search_options", "verbosity",
    "prompt_cache_key", "safety_identifier",
}
MESSAGE_FIELDS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"},
    "tool": {"role", "content", "tool_call_id"},
}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Refused(Exception):
    """Why the real API would refuse a request: its message, the ``param`` it names, the HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status


def _content(message: dict, where: str, *, may_be_null: bool) -> None:
    content = message.get("content")
    if content is None and may_be_null:
        return
    if not isinstance(content, (str, list)):
        raise Refused(f"Invalid type for '{where}.content': expected a string or an array, but got "
                      f"{type(content).__name__}.", f"{where}.content")


def _tool_calls(calls, where: str) -> list[str]:
    if not isinstance(calls, list) or not calls:
        raise Refused(f"Invalid '{where}.tool_calls': empty array. Expected an array with minimum length 1.",
                      f"{where}.tool_calls")
    ids = []
    for j, call in enumerate(calls):
        here = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict) or set(call) - {"id", "type", "function"}:
            raise Refused(f"Additional properties are not allowed - '{here}'", here)
        function = call.get("function")
        if call.get("type") != "function" or not isinstance(call.get("id"), str) or not isinstance(function, dict):
            raise Refused(f"Invalid value for '{here}': expected id, type 'function' and function.", here)
        if set(function) - {"name", "arguments"} or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str):
            raise Refused(f"Invalid '{here}.function': name and arguments must be strings.", f"{here}.function")
        if not TOOL_NAME.match(function["name"]):  # the history's calls too, whatever tools are offered now
            raise Refused(f"Invalid '{here}.function.name': string does not match pattern. Expected a string that "
                          "matches the pattern '^[a-zA-Z0-9_-]+$'.", f"{here}.function.name")
        ids.append(call["id"])
    return ids


def _messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise Refused("Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages")
    owed: list[str] = []  # tool_call ids of the last assistant message still without a tool message
    answerable: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in MESSAGE_FIELDS:
            raise Refused(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', "
                          f"'tool', 'function' and 'developer'.", f"{where}.role")
        extra = sorted(set(message) - MESSAGE_FIELDS[role])
        if extra:
            raise Refused(f"Additional properties are not allowed ({', '.join(map(repr, extra))} was unexpected) "
                          f"- '{where}'", where)
        if owed and role != "tool":
            raise Refused("An assistant message with 'tool_calls' must be followed by tool messages responding to "
                          f"each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                          f"{', '.join(owed)}", where)
        if role == "assistant":
            if "tool_calls" in message:
                owed = _tool_calls(message["tool_calls"], where)
                answerable = set(owed)
            _content(message, where, may_be_null="tool_calls" in message)
        elif role == "tool":
            if message.get("tool_call_id") not in answerable:
                raise Refused("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                              "message with 'tool_calls'.", f"{where}.role")
            owed = [call_id for call_id in owed if call_id != message["tool_call_id"]]
            _content(message, where, may_be_null=False)
        else:
            answerable = set()
            _content(message, where, may_be_null=False)
    if owed:
        raise Refused("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                      f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                      f"{', '.join(owed)}", "messages")


def _tools(tools) -> None:
    if not isinstance(tools, list):
        raise Refused("Invalid type for 'tools': expected an array.", "tools")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or set(tool) != {"type", "function"} or tool["type"] != "function":
            raise Refused(f"Invalid value for '{where}': expected {{'type': 'function', 'function': ...}}.", where)
        function = tool["function"]
        if not isinstance(function, dict) or set(function) - {"name", "description", "parameters", "strict"}:
            raise Refused(f"Additional properties are not allowed - '{where}.function'", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise Refused(f"Invalid '{where}.function.name': string does not match pattern. Expected a string "
                          "that matches the pattern '^[a-zA-Z0-9_-]+$'.", f"{where}.function.name")
        if name in names:
            raise Refused(f"Invalid 'tools': duplicate function name '{name}'.", "tools")
        names.add(name)
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            raise Refused(f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"'.",
                          f"{where}.function.parameters")


def chat_request_problems(body, headers: dict) -> Refused | None:
    """``headers`` with lower-case names. The first way a Chat Completions request breaks the real API's rules (see the module doc), or None."""
    try:
        if not str(headers.get("authorization", "")).startswith("Bearer "):
            raise Refused("You didn't provide an API key.", status=401)
        if not isinstance(body, dict):
            raise Refused("We could not parse the JSON body of your request.")
        for field in body:
            if field not in REQUEST_FIELDS:
                raise Refused(f"Unrecognized request argument supplied: {field}")
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise Refused("you must provide a model parameter", "model")
        _messages(body.get("messages"))
        if "tools" in body:
            _tools(body["tools"])
        elif "tool_choice" in body:
            raise Refused("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                          "specified.", "tool_choice")
        if "stream_options" in body and body.get("stream") is not True:
            raise Refused("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          "stream_options")
        if "max_tokens" in body and "max_completion_tokens" in body:
            raise Refused("max_tokens and max_completion_tokens cannot both be set.", "max_tokens")
        temperature = body.get("temperature", 1)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise Refused(f"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got "
                          f"{temperature} instead.", "temperature")
    except Refused as refused:
        return refused
    return None


class StrictOpenAIServer(ReplayServer):
    """``ReplayServer("openai", script)`` that refuses invalid requests first (see the module doc)."""

    def __init__(self, script: list[dict]):
        super().__init__("openai", script)
        self.violations: list[dict] = []
        self._request = threading.local()  # the headers of the request this thread answers

    def _answer(self, body):
        refused = chat_request_problems(body, getattr(self._request, "headers", {}))
        if refused is None:
            return super()._answer(body)
        with self.lock:
            self.violations.append({"message": str(refused), "param": refused.param, "body": body})
        error = openai_error(refused.status, str(refused))
        error["error"]["param"] = refused.param
        return refused.status, {}, "application/json", json.dumps(error), None

    def _handler(self):
        base = super()._handler()
        server = self

        class Handler(base):
            def do_POST(self):
                server._request.headers = {name.lower(): value for name, value in self.headers.items()}
                super().do_POST()

        return Handler
