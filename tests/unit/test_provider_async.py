"""The HTTP providers' async ``complete`` against a real local server: one attempt, errors that say if they pass.

No run and no engine: each test awaits a client's ``complete`` itself
(``asyncio.run``), against a ``ReplayServer`` configured as an operator's
endpoint profile.
"""

import asyncio
import email.utils
import gc
import json
import threading
import time
import warnings

import pytest

from runs.providers import get_client
from runs.base.model_call import MalformedResponse, ModelError, ModelRequest, StreamInterrupted
from runs.providers.http_config import parse_config
from runs.providers.sdk_calls import SDKClientCache, retry_after_seconds

PROVIDERS = ["openai", "anthropic"]


def request(**fields) -> ModelRequest:
    return ModelRequest(instructions="Be brief.", messages=[{"role": "user", "content": "Hello?"}], tools=[],
                        turn_index=0, run_id=1, **fields)


def failure(config: dict) -> ModelError:
    """The ``ModelError`` one ``complete`` raises (the test fails if it answers)."""
    with pytest.raises(ModelError) as caught:
        asyncio.run(get_client(config).complete(request()))
    return caught.value


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("status", [503, 429])
def test_overloaded_or_rate_limited_is_transient_with_the_servers_wait_and_not_retried(endpoint, provider, status):
    server, config = endpoint(provider, [{"status": status, "headers": {"Retry-After": "7"}}, {"content": "late"}])
    error = failure(config)
    assert (error.transient, error.retry_after_s) == (True, 7.0)
    assert str(error).startswith(f"{'OpenAI' if provider == 'openai' else 'Anthropic'} API error {status} (")
    assert len(server.requests) == 1, "the SDK does not retry"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_bad_request_is_not_transient(endpoint, provider):
    server, config = endpoint(provider, [{"status": 400, "message": "messages: bad"}, {"content": "never"}],
                              stream=False)
    error = failure(config)
    assert (error.transient, error.retry_after_s) == (False, None)
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_refused_connection_is_transient(endpoint, provider):
    server, config = endpoint(provider, [])
    server.stop()
    error = failure(config)
    assert error.transient and "unreachable" in str(error) and not isinstance(error, StreamInterrupted)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_cut_off_mid_answer_is_interrupted_and_transient(endpoint, provider):
    server, config = endpoint(provider, [{"content": "A long answer that will not arrive whole. " * 5,
                                          "cut_after": 400}])
    error = failure(config)
    assert isinstance(error, StreamInterrupted) and error.transient
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("stream", [True, False])
def test_two_event_loops_in_turn_both_get_their_answer(endpoint, provider, stream):
    server, config = endpoint(provider, [{"content": "First answer."}, {"content": "Second answer."}],
                              stream=stream)
    deltas = []
    first = asyncio.run(get_client(config).complete(request(on_delta=lambda kind, data: deltas.append(data))))
    second = asyncio.run(get_client(config).complete(request()))  # a new loop; the first one is closed
    assert (first.content, second.content) == ("First answer.", "Second answer.")
    assert len(server.requests) == 2
    assert "".join(d["text"] for d in deltas) == ("First answer." if stream else "")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_client_exposes_the_timeout_the_sdk_is_given(endpoint, provider, settings):
    _, config = endpoint(provider, [])
    assert get_client({**config, "timeout_s": 2.5}).timeout_s == 2.5
    assert get_client(config).timeout_s == settings.TOLLGATE["MODEL_TIMEOUT_S"]


def test_scripted_client_has_a_timeout_too(settings):
    assert get_client({"provider": "scripted", "turns": []}).timeout_s == settings.TOLLGATE["MODEL_TIMEOUT_S"]


def test_retry_after_is_read_in_seconds_milliseconds_or_as_a_date():
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({"retry-after": "1.5", "retry-after-ms": "250"}) == 0.25
    assert 55 <= retry_after_seconds({"retry-after": in_a_minute}) <= 60
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # passed
    assert retry_after_seconds({"retry-after": "-3"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after-ms": "nan"}) is None
    assert retry_after_seconds({}) is None


def test_the_client_cache_reuses_a_client_within_a_loop_and_never_across_loops(endpoint):
    _, config = endpoint("openai", [])
    cfg = parse_config(config, default_key_env="OPENAI_API_KEY")
    cache = SDKClientCache(lambda **options: options)

    async def twice():
        return cache.get(cfg), cache.get(cfg)

    first, again = asyncio.run(twice())
    later, _ = asyncio.run(twice())
    assert first is again and later is not first
    assert first == {"api_key": "x", "base_url": cfg.base_url, "timeout": cfg.timeout_s, "max_retries": 0}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_server_silent_past_the_timeout_is_a_transient_timeout_not_unreachable(endpoint, provider):
    _, config = endpoint(provider, [{"content": "late", "delay_s": 3}], timeout_s=0.5)
    error = failure(config)
    assert error.transient and "timed out after 0.5s" in str(error)


def _sse(events: list[tuple[str | None, object]]) -> str:
    return "".join((f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n" for name, data in events)


OPENAI_END = ("", {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
# Streams whose JSON parses but holds a field of the wrong type: each answer is MalformedResponse, never a crash.
WRONG_TYPES = {
    "openai": [
        [(None, {"choices": "not a list"}), OPENAI_END],
        [(None, {"choices": [{"index": 0, "delta": {"content": 5}}]}), OPENAI_END],
        [(None, {"choices": [{"index": 0, "delta": "text"}]}), OPENAI_END],
        [(None, {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0", "function": {"name": "x"}}]}}]}),
         OPENAI_END],
        [(None, {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": {}}}]}}]}),
         OPENAI_END],
        [(None, ["a list, not a chunk"]), OPENAI_END],
        [(None, {"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]})],
    ],
    "anthropic": [
        [("message_start", {"type": "message_start", "message": {"usage": "none"}})],
        [("content_block_start", {"type": "content_block_start", "index": 0, "content_block": ["tool_use"]})],
        [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "text_delta", "text": 7}})],
        [("content_block_delta", {"type": "content_block_delta", "delta": {"type": "input_json_delta"}})],
        [("message_delta", {"type": "message_delta", "delta": {"stop_reason": ["end_turn"]}, "usage": {}})],
        [("message_stop", {"no": "type"})],
    ],
}


@pytest.mark.parametrize("provider, events", [(p, e) for p, cases in WRONG_TYPES.items() for e in cases])
def test_a_streamed_field_of_the_wrong_type_is_a_malformed_response(endpoint, provider, events):
    if provider == "openai":
        events = [*events, (None, "[DONE]")]
    raw = _sse(events).replace('data: "[DONE]"', "data: [DONE]")
    _, config = endpoint(provider, [{"raw": raw, "content_type": "text/event-stream"}])
    error = failure(config)
    assert isinstance(error, MalformedResponse) and "Malformed" in str(error)


@pytest.mark.parametrize("provider, body", [
    ("openai", {"choices": [{"message": {"content": ["not", "text"]}, "finish_reason": "stop"}]}),
    ("openai", {"choices": [{"message": {"tool_calls": [{"id": "c1"}]}, "finish_reason": "tool_calls"}]}),
    ("openai", {"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": "many"}}),
    ("anthropic", {"content": [{"type": "text", "text": None}, {"type": 3}], "stop_reason": "end_turn"}),
    ("anthropic", {"content": [{"type": "tool_use", "id": "t1", "name": "x", "input": "not an object"}]}),
    ("anthropic", {"content": "text"}),
])
def test_a_whole_answer_with_a_field_of_the_wrong_type_is_a_malformed_response(endpoint, provider, body):
    _, config = endpoint(provider, [{"raw": json.dumps(body)}], stream=False)
    assert isinstance(failure(config), MalformedResponse)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_closing_the_cache_at_exit_closes_each_client_on_its_running_loop(endpoint, provider):
    from runs.providers import anthropic_provider, openai_provider

    cache = (openai_provider if provider == "openai" else anthropic_provider)._CLIENTS
    _, config = endpoint(provider, [{"content": "Hello."}])
    cache.close_all()  # earlier tests' clients, on loops closed since: forgotten, collected now
    gc.collect()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        answer = asyncio.run_coroutine_threadsafe(get_client(config).complete(request()), loop).result(10)
        assert answer.content == "Hello."
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.close_all()
            gc.collect()
        assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
