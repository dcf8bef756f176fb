"""A local replay server speaking the OpenAI and Anthropic HTTP wire formats.

``ReplayServer(provider, script)`` listens on 127.0.0.1 (a real socket, a
``ThreadingHTTPServer`` in a daemon thread) and answers, in order, one
script entry per request to ``POST /v1/chat/completions`` (OpenAI Chat
Completions) or ``POST /v1/messages`` (Anthropic Messages). It records
every request (``server.requests``: ``{"path", "headers", "body"}``).

A script entry is one of:

* a model turn, provider-neutral: ``{"content": str, "tool_calls":
  [{"id"?, "name", "arguments": raw str}], "finish_reason": "stop" |
  "tool_calls" | "length" (default: from the calls), "usage":
  {"input_tokens", "output_tokens"}}``. It is rendered as a JSON body or,
  when the request asked for ``"stream": true``, as server-sent events —
  each in the provider's documented format (OpenAI ``chat.completion`` /
  ``chat.completion.chunk`` ending with ``data: [DONE]``; Anthropic
  ``message`` / ``message_start``, ``content_block_start``,
  ``content_block_delta`` (``text_delta``, ``input_json_delta``),
  ``content_block_stop``, ``message_delta``, ``message_stop``). Streamed
  text and tool arguments are split into small fragments.
* an error: ``{"status": 429, "message": str, "headers": {...}}`` with the
  provider's error body.
* raw bytes: ``{"raw": str, "content_type": str}`` (malformed answers).

Any entry may add ``"delay_s": float`` (the answer is sent that late) and
``"cut_after": int`` (only that many bytes of the answer are sent before the
connection is closed: a stream that breaks off mid-response).

When the script is used up the server answers 400 "replay script
exhausted", so a test that needs more turns fails loudly.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FRAGMENT = 7  # characters per streamed fragment
OPENAI_FINISH = {"stop": "stop", "tool_calls": "tool_calls", "length": "length"}
ANTHROPIC_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def _pieces(text: str) -> list[str]:
    return [text[i:i + FRAGMENT] for i in range(0, len(text), FRAGMENT)] or [""]


def _finish(turn: dict) -> str:
    return turn.get("finish_reason") or ("tool_calls" if turn.get("tool_calls") else "stop")


def _usage(turn: dict) -> tuple[int, int]:
    usage = turn.get("usage") or {}
    return usage.get("input_tokens", 10), usage.get("output_tokens", 5)


def _call_ids(turn: dict, prefix: str, n: int) -> list[dict]:
    return [{**call, "id": call.get("id") or f"{prefix}{n}_{i}"} for i, call in enumerate(turn.get("tool_calls") or [])]


def _sse(events: list[tuple[str | None, object]]) -> str:
    out = []
    for name, data in events:
        line = data if isinstance(data, str) else json.dumps(data)
        out.append((f"event: {name}\n" if name else "") + f"data: {line}\n\n")
    return "".join(out)


# --- OpenAI Chat Completions -------------------------------------------------

def openai_json(turn: dict, n: int, model: str) -> dict:
    calls = _call_ids(turn, "call_", n)
    message = {"role": "assistant", "content": turn.get("content") or None, "refusal": None}
    if calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    prompt, completion = _usage(turn)
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1700000000 + n, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": OPENAI_FINISH[_finish(turn)]}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


def openai_sse(turn: dict, n: int, model: str) -> str:
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1700000000 + n, "model": model}

    def chunk(delta: dict, finish=None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(turn["content"])] if turn.get("content") else []
    for i, call in enumerate(_call_ids(turn, "call_", n)):
        events.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                             "function": {"name": call["name"], "arguments": ""}}]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                   for piece in _pieces(call["arguments"]) if piece]
    events.append(chunk({}, OPENAI_FINISH[_finish(turn)]))
    prompt, completion = _usage(turn)
    events.append({**base, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                     "total_tokens": prompt + completion}})
    return _sse([(None, e) for e in events] + [(None, "[DONE]")])


def openai_error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "api_error"), "param": None,
                      "code": None}}


# --- Anthropic Messages ------------------------------------------------------

def anthropic_json(turn: dict, n: int, model: str) -> dict:
    content = [{"type": "text", "text": turn["content"]}] if turn.get("content") else []
    for call in _call_ids(turn, "toolu_", n):
        content.append({"type": "tool_use", "id": call["id"], "name": call["name"],
                        "input": json.loads(call["arguments"] or "{}")})
    prompt, completion = _usage(turn)
    return {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": ANTHROPIC_STOP[_finish(turn)], "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion}}


def anthropic_sse(turn: dict, n: int, model: str) -> str:
    prompt, completion = _usage(turn)
    events = [("message_start", {"type": "message_start", "message": {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prompt, "output_tokens": 1}}})]
    index = 0
    if turn.get("content"):
        events.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}))
        events.append(("ping", {"type": "ping"}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": piece}})
                   for piece in _pieces(turn["content"])]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    for call in _call_ids(turn, "toolu_", n):
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": call["id"], "name": call["name"], "input": {}}}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                            "delta": {"type": "input_json_delta", "partial_json": piece}})
                   for piece in _pieces(call["arguments"])]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": ANTHROPIC_STOP[_finish(turn)], "stop_sequence": None},
                                     "usage": {"output_tokens": completion}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return _sse(events)


def anthropic_error(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


RENDER = {
    "openai": {"path": "/v1/chat/completions", "json": openai_json, "sse": openai_sse, "error": openai_error},
    "anthropic": {"path": "/v1/messages", "json": anthropic_json, "sse": anthropic_sse, "error": anthropic_error},
}


class ReplayServer:
    """See the module docstring. Use as a context manager or ``start()``/``stop()``."""

    def __init__(self, provider: str, script: list[dict]):
        self.provider = provider
        self.render = RENDER[provider]
        self.script = list(script)
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """What goes into the agent's ``base_url`` (the OpenAI SDK wants the ``/v1`` prefix)."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}" + ("/v1" if self.provider == "openai" else "")

    def start(self) -> "ReplayServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def bodies(self) -> list[dict]:
        """The JSON bodies of every model request received, in order."""
        return [r["body"] for r in self.requests]

    def _answer(self, body: dict) -> tuple[int, dict, str, str, int | None]:
        """(status, headers, content type, text, bytes to send or None for all) for the next request."""
        with self.lock:
            n = len(self.requests)
            entry = self.script.pop(0) if self.script else None
        cut = entry.get("cut_after") if entry else None
        return (*self._render(entry, body, n), cut)

    def _render(self, entry: dict | None, body: dict, n: int) -> tuple[int, dict, str, str]:
        if entry is not None and entry.get("delay_s"):
            time.sleep(entry["delay_s"])
        if entry is None:
            return 400, {}, "application/json", json.dumps(self.render["error"](400, "replay script exhausted"))
        if "raw" in entry:
            return entry.get("status", 200), {}, entry.get("content_type", "application/json"), entry["raw"]
        if "status" in entry:
            error = self.render["error"](entry["status"], entry.get("message", "error"))
            return entry["status"], entry.get("headers", {}), "application/json", json.dumps(error)
        model = body.get("model", "test-model")
        if body.get("stream"):
            return 200, {}, "text/event-stream", self.render["sse"](entry, n, model)
        return 200, {}, "application/json", json.dumps(self.render["json"](entry, n, model))

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # no ~40 ms stall between the headers and the body on kept-alive connections

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.split("?")[0] != server.render["path"]:
                    self._send(404, {}, "application/json", json.dumps({"error": {"message": "not found"}}))
                    return
                body = json.loads(raw or b"{}")
                status, headers, content_type, text, cut = server._answer(body)
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                self._send(status, headers, content_type, text, cut)

            def _send(self, status, headers, content_type, text, cut=None):
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if cut is None:
                    self.wfile.write(data)
                    return
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True

        return Handler
