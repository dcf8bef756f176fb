"""The HTTP providers on the wire (``client.post`` over the SDKs' aiohttp transport): what a server may send back.

Like ``test_provider_async``: no run and no engine, each test awaits a
client's ``complete`` itself against a local server configured as an
operator's endpoint profile. Every answer a server sends must end in a
``ModelResponse`` or a ``ModelError`` (``MalformedResponse``,
``StreamInterrupted``), never another exception.
"""

import asyncio
import gc
import json
import socket
import struct
import threading
import time

import anthropic
import openai
import pytest

from runs.base.model_call import ConfigError, MalformedResponse, ModelError, ModelRequest, StreamInterrupted
from runs.providers import anthropic_provider, get_client, openai_provider
from runs.providers.sdk_calls import SDKClientCache

PROVIDERS = ["openai", "anthropic"]


def request(**fields) -> ModelRequest:
    return ModelRequest(instructions="Be brief.", messages=[{"role": "user", "content": "Hello?"}], tools=[],
                        turn_index=0, run_id=1, **fields)


def answer(config: dict):
    return asyncio.run(get_client(config).complete(request()))


def failure(config: dict) -> ModelError:
    """The ``ModelError`` one ``complete`` raises (the test fails if it answers or raises anything else)."""
    with pytest.raises(ModelError) as caught:
        answer(config)
    return caught.value


def sse(events: list[tuple[str | None, object]]) -> dict:
    """A raw script entry: server-sent events, each ``(event name or None, data: JSON value or a raw str)``."""
    text = "".join((f"event: {name}\n" if name else "") + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
                   for name, data in events)
    return {"raw": text, "content_type": "text/event-stream"}


def chunk(delta: dict, finish: str | None = None) -> tuple[None, dict]:
    """One OpenAI ``chat.completion.chunk`` event."""
    return None, {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-test",
                  "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def on_a_loop_in_a_thread():
    """(loop, call(coroutine) -> its result, stop()): an event loop running in a thread, as the engine's is."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(10)

    def stop():
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()

    return loop, call, stop


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_client_evicted_from_the_cache_is_closed_not_left_for_the_collector_to_report(endpoint, provider,
                                                                                         monkeypatch, caplog, settings):
    # More (key, base URL, timeout) combinations than max_clients on the engine's one loop: the oldest client is
    # dropped, and closed on its loop once MODEL_CALL_MAX_S has passed (no call can be using it then), before
    # anything collects it: no "Unclosed client session" (ERROR, from asyncio) nor "Unclosed connector".
    settings.TOLLGATE = {**settings.TOLLGATE, "MODEL_CALL_MAX_S": 0.2}
    module, sdk, factory = ((openai_provider, openai, openai.AsyncOpenAI) if provider == "openai"
                            else (anthropic_provider, anthropic, anthropic.AsyncAnthropic))
    cache = SDKClientCache(factory, sdk.DefaultAioHttpClient, max_clients=1)
    monkeypatch.setattr(module, "_CLIENTS", cache)
    _, config = endpoint(provider, [{"content": "One."}, {"content": "Two."}])
    gc.collect()  # what earlier tests left
    caplog.clear()
    loop, call, stop = on_a_loop_in_a_thread()
    try:
        assert call(get_client({**config, "timeout_s": 5}).complete(request())).content == "One."
        first = call(_cached(cache, {**config, "timeout_s": 5}))
        assert call(get_client({**config, "timeout_s": 6}).complete(request())).content == "Two."  # evicts the first
        assert not first.is_closed()  # a call may still be using it
        call(asyncio.sleep(0.5))
        assert first.is_closed()
        del first
        gc.collect()
        call(asyncio.sleep(0.05))
        unclosed = [r.getMessage().splitlines()[0] for r in caplog.records if "Unclosed" in r.getMessage()]
        assert not unclosed
    finally:
        cache.close_all()
        stop()


async def _cached(cache: SDKClientCache, config: dict):
    """The client ``cache`` holds for ``config`` on the running loop."""
    return cache.get(get_client(config).config)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_timeout_of_zero_seconds_never_means_waiting_for_ever(endpoint, provider):
    # config_problems accepts "timeout_s": 0 (only a negative one is refused). Through httpx it allowed no
    # silence at all (a timeout at once); aiohttp's ClientTimeout takes 0 for "no timeout", so the call now waits
    # for the late answer however late it is (only the engine's MODEL_CALL_MAX_S ends it). Either refuse the
    # config or time out: never an unbounded wait.
    _, config = endpoint(provider, [{"content": "Late.", "delay_s": 2}], timeout_s=0)
    with pytest.raises((ModelError, ConfigError)):
        answer(config)


def test_an_openai_error_event_mid_stream_is_a_model_error_with_the_servers_message(endpoint):
    # OpenAI and compatible servers (vLLM, LiteLLM) report a failure after the 200 as a chunk {"error": {...}}; the
    # SDK's stream reader raises a bare openai.APIError for it, which sdk_call does not map: it escapes complete().
    _, config = endpoint("openai", [sse([chunk({"role": "assistant", "content": "Hel"}),
                                         (None, {"error": {"message": "The server had an error while processing "
                                                                      "your request.", "type": "server_error"}})])])
    error = failure(config)
    assert "The server had an error" in error.detail


def test_an_anthropic_overloaded_error_event_mid_stream_is_transient(endpoint):
    # Anthropic's documented mid-stream error: event "error", {"type": "error", "error": {"type":
    # "overloaded_error"}} after a 200. The SDK raises an APIStatusError with the stream's status (200), which
    # sdk_call maps to a non-transient "Anthropic API error 200": the run fails where a 529 would be retried.
    _, config = endpoint("anthropic", [sse([
        ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 1}}}),
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})])])
    error = failure(config)
    assert error.transient


DEEP = "[" * 100_000 + "]" * 100_000  # legal JSON; Python's decoder gives up with a RecursionError


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stream", [False, True])
def test_json_nested_too_deep_to_decode_is_a_malformed_response(endpoint, provider, stream):
    # The SDK's json.loads raises RecursionError (a RuntimeError), which sdk_call does not map: it escapes.
    if not stream:
        entry = {"raw": DEEP}
    elif provider == "openai":
        entry = sse([(None, DEEP), (None, "[DONE]")])
    else:
        entry = sse([("message_start", DEEP), ("message_stop", {"type": "message_stop"})])
    _, config = endpoint(provider, [entry], stream=stream)
    assert isinstance(failure(config), MalformedResponse)


def test_streamed_openai_tool_calls_without_index_stay_separate_calls(endpoint):
    # Some compatible servers send each streamed tool call whole and without "index". _read_stream counts a
    # missing index as 0, so a second call is merged into the first: the second's id with the first's name and
    # both argument strings run together ('{}{"x": 1}').
    first = {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    second = {"id": "call_b", "type": "function", "function": {"name": "transfer", "arguments": '{"x": 1}'}}
    _, config = endpoint("openai", [sse([chunk({"role": "assistant", "tool_calls": [first]}),
                                         chunk({"tool_calls": [second]}), chunk({}, "tool_calls"),
                                         (None, "[DONE]")])])
    assert answer(config).tool_calls == [{"id": "call_a", "name": "lookup", "arguments": "{}"},
                                         {"id": "call_b", "name": "transfer", "arguments": '{"x": 1}'}]


# --- Gaps covered (these pass): what a good or odd-but-legal answer gives, the request on the wire, the transport's errors.

TOOLS = [{"name": "lookup", "description": "Look up.", "parameters": {"type": "object",
                                                                       "properties": {"key": {"type": "string"}}}}]
HISTORY = [{"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "lookup", "arguments": '{"key": "a"}'}]},
           {"role": "tool", "tool_call_id": "c1", "content": "found"}, {"role": "system", "content": "note"}]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stream", [False, True])
def test_the_request_on_the_wire_is_the_one_the_sdks_typed_method_sends(endpoint, provider, stream, settings):
    server, config = endpoint(provider, [{"content": "A."}, {"content": "B."}], stream=stream, max_output_tokens=99,
                              **({"temperature": 0.5} if provider == "openai" else {}))  # anthropic's create() has none
    ours = ModelRequest(instructions="Be brief.", messages=HISTORY, tools=TOOLS, turn_index=0, run_id=1)

    async def both():
        await get_client(config).complete(ours)
        if provider == "openai":
            typed = openai.AsyncOpenAI(api_key="x", base_url=server.base_url, max_retries=0, timeout=config_timeout)
            params = {"model": config["model"], "temperature": 0.5, "max_completion_tokens": 99, "tools":
                      openai_provider.to_openai_tools(TOOLS),
                      "messages": openai_provider.to_openai_messages(ours.instructions, HISTORY)}
            create = typed.chat.completions.create
            extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        else:
            typed = anthropic.AsyncAnthropic(api_key="x", base_url=server.base_url, max_retries=0, timeout=config_timeout)
            params = {"model": config["model"], "max_tokens": 99, "system": ours.instructions,
                      "tools": anthropic_provider.to_anthropic_tools(TOOLS),
                      "messages": anthropic_provider.to_anthropic_messages(HISTORY)}
            create = typed.messages.create
            extra = {"stream": True} if stream else {}
        answer = await create(**params, **extra)
        if stream:
            async for _ in answer:
                pass
        await typed.close()

    config_timeout = settings.TOLLGATE["MODEL_TIMEOUT_S"]
    asyncio.run(both())
    sent, typed_sent = server.requests
    assert sent["path"] == typed_sent["path"]
    assert sent["body"] == typed_sent["body"]
    assert {k.lower(): v for k, v in sent["headers"].items()} == {k.lower(): v for k, v in typed_sent["headers"].items()}


def test_odd_but_legal_openai_chunks_give_the_answer(endpoint):
    usage_first = (None, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    nulls = (None, {"choices": [{"index": 0, "delta": {"content": None, "tool_calls": None}, "finish_reason": None}],
                    "usage": None})
    _, config = endpoint("openai", [sse([usage_first, nulls, chunk({"content": "Hi"}), chunk({}, "stop"),
                                         (None, {"choices": [], "usage": None}), (None, "[DONE]")])])
    got = answer(config)
    assert (got.content, got.tool_calls, got.finish_reason, got.input_tokens, got.output_tokens) == ("Hi", [], "stop", 3, 2)


def test_anthropic_thinking_ping_and_a_message_delta_without_usage_give_the_answer_with_cache_tokens(endpoint):
    usage = {"input_tokens": 3, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 4, "output_tokens": 1}
    _, config = endpoint("anthropic", [sse([
        ("message_start", {"type": "message_start", "message": {"usage": usage}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "thinking", "thinking": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "thinking_delta", "thinking": "Hm."}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "signature_delta", "signature": "sig"}}),
        ("ping", {"type": "ping"}),
        ("content_block_start", {"type": "content_block_start", "index": 1,
                                 "content_block": {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "input_json_delta", "partial_json": '{"key": '}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "input_json_delta", "partial_json": '"a"}'}}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
        ("message_stop", {"type": "message_stop"})])])
    got = answer(config)
    assert got.tool_calls == [{"id": "toolu_1", "name": "lookup", "arguments": '{"key": "a"}'}]
    assert (got.content, got.finish_reason, got.input_tokens, got.output_tokens) == ("", "tool_calls", 12, 1)


class RawServer:
    """Reads one request per connection and sends ``reply`` (bytes, as they are); then closes the connection, or
    with ``reset`` resets it (RST)."""

    def __init__(self, reply: bytes, prefix: str, *, reset: bool = False):
        self.reply, self.prefix, self.reset = reply, prefix, reset
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}{self.prefix}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536) or b"\r\n\r\n"
                if self.reply:
                    conn.sendall(self.reply)
                    time.sleep(0.1)
                if self.reset:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("mid_stream", [False, True])
def test_a_reset_connection_is_unreachable_or_interrupted_never_a_timeout(provider, mid_stream, monkeypatch, settings):
    # The aiohttp transport maps any ClientConnectionError to httpx2.ConnectTimeout (sdk_calls._timed_out).
    monkeypatch.setenv("TEST_KEY", "x")
    first_event = (b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n' if provider == "openai" else
                   b'event: message_start\ndata: {"type": "message_start", "message": {"usage": {}}}\n\n')
    before = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"%x\r\n%s\r\n" % (len(first_event), first_event)) if mid_stream else b""
    server = RawServer(before, "/v1" if provider == "openai" else "", reset=True)
    settings.TOLLGATE = {**settings.TOLLGATE, "MODEL_ENDPOINTS": {**settings.TOLLGATE["MODEL_ENDPOINTS"], "resetting": {
        "provider": provider, "base_url": server.base_url, "api_key_env": "TEST_KEY"}}}
    try:
        error = failure({"provider": provider, "model": "m", "endpoint": "resetting", "stream": True})
    finally:
        server.sock.close()
    assert error.transient and "timed out" not in str(error)
    assert isinstance(error, StreamInterrupted) if mid_stream else "unreachable" in str(error)


# --- What a server's words may reach, a default timeout of 0, and an answer head that does not parse.

ECHOED_KEY = "tollgate_live_key_4f7c1e9a2b"  # an API key that happens to be a Python identifier


def _error_event(provider: str, error: dict) -> dict:
    if provider == "openai":
        return sse([chunk({"role": "assistant", "content": "Hel"}), (None, {"error": error})])
    return sse([("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
                ("error", {"type": "error", "error": error})])


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kind", [ECHOED_KEY, "overloaded" * 2000], ids=["the-key", "20000-chars"])
def test_the_type_of_an_error_event_reaches_the_runs_error_masked_and_bounded(endpoint, provider, kind,
                                                                               monkeypatch):
    # An error event's "type" names the ModelError only when it is one the providers document (_error_in_answer):
    # anything else is server text, which reaches the run's stored error only masked and cut (server_message).
    # A server (or a proxy) that echoes the key it was sent, or sends a long type, must not put it in the run.
    _, config = endpoint(provider, [_error_event(provider, {"type": kind, "message": "Overloaded"})])
    monkeypatch.setenv("TEST_KEY", ECHOED_KEY)  # the endpoint's key (read when the client is made)
    error = failure(config)
    stored = error.readable()
    assert "Overloaded" in stored
    assert ECHOED_KEY not in stored, stored
    assert len(stored) <= 400, f"{len(stored)} characters of the server's text kept"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_default_timeout_of_zero_seconds_never_means_waiting_for_ever(endpoint, provider, settings):
    # aiohttp reads a timeout of 0 as "no timeout". An agent without timeout_s takes TOLLGATE["MODEL_TIMEOUT_S"]
    # (TOLLGATE_MODEL_TIMEOUT_S): set to 0, a call must fail, never wait for a silent server without bound.
    settings.TOLLGATE = {**settings.TOLLGATE, "MODEL_TIMEOUT_S": 0.0}
    _, config = endpoint(provider, [{"content": "Late.", "delay_s": 2}])
    with pytest.raises((ModelError, ConfigError)):
        answer(config)


BAD_HEADS = {
    "not-http": b"garbage from a server that does not speak HTTP\r\n\r\n",
    "header-over-8k": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Trace: " + b"a" * 9000
                      + b"\r\nContent-Length: 2\r\n\r\n{}",
}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("head", list(BAD_HEADS))
def test_an_answer_whose_http_head_does_not_parse_is_a_model_error(provider, head, monkeypatch, settings):
    # aiohttp raises ClientResponseError (400, "Bad status line" / "Got more than 8190 bytes") for an answer head
    # it cannot parse, which the SDKs' aiohttp transport does not map (the openai SDK wraps only
    # httpx2.RequestError): it must still end as a ModelError, never escape complete().
    monkeypatch.setenv("TEST_KEY", "x")
    server = RawServer(BAD_HEADS[head], "/v1" if provider == "openai" else "")
    settings.TOLLGATE = {**settings.TOLLGATE, "MODEL_ENDPOINTS": {**settings.TOLLGATE["MODEL_ENDPOINTS"], "raw": {
        "provider": provider, "base_url": server.base_url, "api_key_env": "TEST_KEY"}}}
    try:
        error = failure({"provider": provider, "model": "m", "endpoint": "raw", "stream": False})
    finally:
        server.sock.close()
    assert "API" in str(error) or "Malformed" in str(error)
