"""An OpenAI-compatible model server that answers every request after a fixed delay (bench/latency.py).

Run: ``python -m bench.fake_model_server --port 8799 --latency 1.0``.
One asyncio process, HTTP/1.1 with keep-alive, no dependency beyond the
standard library (the bodies are rendered by ``tests/support/fakes/llm_server.py``,
the tests' replay server, in the documented OpenAI wire format).

``POST /v1/chat/completions`` waits ``--latency`` seconds, then answers
as JSON or, when the request asks for ``"stream": true``, as server-sent
events (``chat.completion.chunk`` ... ``data: [DONE]``, sent at once after
the delay). The answer follows from the request alone, so one server
serves any number of runs:

* no ``tool`` message yet -> a call of the lookup tool (``--lookup-tool``,
  default ``query_order``) with ``{"order_id": N}``;
* one tool result -> a call of the side-effect tool (``--effect-tool``,
  default ``refund``) with ``{"order_id": N, "amount": --amount}``;
* two or more -> a final text.

``N`` is the first number after "order" in the first user message
(e.g. "refund order 1000001"); a request without one gets a 400 in the
OpenAI error format.

``GET /stats`` -> ``{"in_flight", "max_in_flight", "requests", "answered",
"streamed", "errors", "answers": {"lookup", "effect", "final"}}``: a request
is in flight from the moment its body has been read until its answer has
been written; ``POST /stats/reset`` zeroes the counters (``max_in_flight``
starts again from the requests in flight now). ``GET /health`` -> 200.
"""

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fakes.llm_server import openai_error, openai_json, openai_sse  # noqa: E402

ORDER = re.compile(r"order\D*?(\d+)", re.IGNORECASE)
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


class FakeModel:
    """The answers and the counters of one server."""

    def __init__(self, latency_s: float, lookup_tool: str, effect_tool: str, amount: float):
        self.latency_s = latency_s
        self.lookup_tool = lookup_tool
        self.effect_tool = effect_tool
        self.amount = amount
        self.in_flight = 0
        self.reset()

    def reset(self) -> None:
        self.max_in_flight = self.in_flight
        self.requests = self.answered = self.streamed = self.errors = 0
        self.answers = {"lookup": 0, "effect": 0, "final": 0}

    def stats(self) -> dict:
        return {"in_flight": self.in_flight, "max_in_flight": self.max_in_flight, "requests": self.requests,
                "answered": self.answered, "streamed": self.streamed, "errors": self.errors,
                "answers": dict(self.answers)}

    def turn(self, body: dict) -> tuple[str, dict] | None:
        """``(kind, provider-neutral turn)`` for a Chat Completions request body; None if it names no order."""
        messages = body.get("messages") or []
        first_user = next((m.get("content") for m in messages if m.get("role") == "user"), None)
        found = ORDER.search(first_user) if isinstance(first_user, str) else None
        if found is None:
            return None
        order_id = int(found.group(1))
        results = sum(1 for m in messages if m.get("role") == "tool")
        if results == 0:
            return "lookup", {"tool_calls": [{"name": self.lookup_tool,
                                              "arguments": json.dumps({"order_id": order_id})}]}
        if results == 1:
            return "effect", {"tool_calls": [{"name": self.effect_tool,
                                              "arguments": json.dumps({"order_id": order_id,
                                                                       "amount": self.amount})}]}
        return "final", {"content": f"Refunded {self.amount:.2f} on order {order_id}."}

    async def complete(self, raw: bytes) -> tuple[int, str, bytes]:
        """``(status, content type, body)`` of one ``POST /v1/chat/completions``, after the delay."""
        self.requests += 1
        await asyncio.sleep(self.latency_s)
        try:
            body = json.loads(raw)
            decided = self.turn(body)
        except (ValueError, AttributeError):
            decided = None
        if decided is None:
            self.errors += 1
            return 400, "application/json", json.dumps(openai_error(400, "no order number in the first user "
                                                                          "message")).encode()
        kind, turn = decided
        self.answers[kind] += 1
        self.answered += 1
        model = str(body.get("model") or "fake")
        if body.get("stream"):
            self.streamed += 1
            return 200, "text/event-stream", openai_sse(turn, self.requests, model).encode()
        return 200, "application/json", json.dumps(openai_json(turn, self.requests, model)).encode()

    async def route(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if path == "/v1/chat/completions":
            if method != "POST":
                return 405, "text/plain", b"POST only\n"
            return await self.complete(body)
        if path == "/stats" and method == "GET":
            return 200, "application/json", json.dumps(self.stats()).encode()
        if path == "/stats/reset" and method == "POST":
            self.reset()
            return 200, "application/json", json.dumps(self.stats()).encode()
        if path == "/health":
            return 200, "text/plain", b"ok\n"
        return 404, "text/plain", b"not found\n"

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer requests on one connection until the client closes it or asks to (``Connection: close``)."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _version = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                close = headers.get("connection", "").lower() == "close"
                is_completion = path.startswith("/v1/chat/completions")
                if is_completion:
                    self.in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    status, content_type, payload = await self.route(method, path, body)
                    writer.write(f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
                                 f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
                                 f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n".encode() + payload)
                    await writer.drain()
                finally:
                    if is_completion:
                        self.in_flight -= 1
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()


async def serve(args) -> None:
    model = FakeModel(args.latency, args.lookup_tool, args.effect_tool, args.amount)
    server = await asyncio.start_server(model.serve_connection, args.host, args.port, backlog=4096)
    print(f"fake model server on http://{args.host}:{args.port}/v1, latency {args.latency} s", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds before every answer (default 1.0)")
    parser.add_argument("--lookup-tool", default="query_order", help="the first tool called (default query_order)")
    parser.add_argument("--effect-tool", default="refund", help="the second tool called (default refund)")
    parser.add_argument("--amount", type=float, default=20.0,
                        help="the side-effect tool's amount argument (default 20.0)")
    try:
        asyncio.run(serve(parser.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
