"""One request of the HTTP providers (``openai``, ``anthropic``) through their SDK, and what its errors mean.

Calls are async (``openai.AsyncOpenAI``, ``anthropic.AsyncAnthropic``)
and make one attempt: the SDKs' own retries are off (``max_retries=0``).
Each call goes through the SDK's request layer (``client.post``: its
auth headers, timeouts, error classes and server-sent-event reader) over
the SDK's aiohttp transport (``DefaultAioHttpClient``), with a body that
the provider built as plain JSON and an answer read as decoded JSON
(``post_json``, ``json_field``): the SDKs' typed layer, which walks its
parameter annotations over the whole history for every request and
builds a model object for every streamed chunk, with its httpx transport,
cost 2.0 of a streamed call's 2.7 ms of CPU (``bench/client_floor.py``).
An error worth retrying is a ``ModelError`` with ``transient`` set and,
when the server said how long to wait, ``retry_after_s``
(``transient_status``, ``retry_after_seconds``); the config's
``max_retries`` is how often the caller may retry one.
"""

import asyncio
import atexit
import email.utils
import logging
import math
import threading
import time

import aiohttp
import httpx2
from django.conf import settings

from runs.base.masking import mask_log_text
from runs.base.model_call import MalformedResponse, ModelError, StreamInterrupted
from runs.providers.http_config import HttpModelConfig

log = logging.getLogger(__name__)
SERVER_MESSAGE_CHARS = 300


def server_message(body) -> str:
    """What a model server said in an error answer (``APIStatusError.body``), fit for the run's readers (docs/design.md#model-errors).

    The error object's ``message`` (OpenAI's, Anthropic's, or the object itself) or a plain-text body, never more; masked
    (``runs.base.masking.mask_log_text``), NULs replaced, at most ``SERVER_MESSAGE_CHARS`` characters; ``""`` otherwise.
    """
    found = body
    if isinstance(found, dict):
        found = found.get("error", found)
    if isinstance(found, dict):
        found = found.get("message")
    if not isinstance(found, str):
        return ""
    text = mask_log_text(found.strip()).replace("\x00", "\ufffd")
    return text if len(text) <= SERVER_MESSAGE_CHARS else text[: SERVER_MESSAGE_CHARS - 1] + "…"

def status_error_message(provider: str, status: int, error_class: str) -> str:
    """The one-line name of an HTTP error answer: status and ``error_class``, the SDK's exception class
    (e.g. ``RateLimitError``); the server's words go beside it (``server_message``)."""
    return f"{provider} API error {status} ({error_class})"


def transient_status(status: int) -> bool:
    """Whether an HTTP error status is worth retrying later: 408, 409, 429 and 5xx (not other 4xx)."""
    return status in (408, 409, 429) or status >= 500


def retry_after_seconds(headers) -> float | None:
    """The seconds (0 or more) an error answer's ``headers`` ask to wait, or ``None`` if they do not say.

    ``retry-after-ms`` (milliseconds) wins over ``Retry-After``, which is
    seconds or an HTTP date (the wait is then until that date, 0 if it
    has passed). A value that does not parse, or is not finite, says nothing.
    """
    for name, divisor in (("retry-after-ms", 1000), ("retry-after", 1)):
        try:
            seconds = float(headers.get(name) or "") / divisor
        except ValueError:
            continue
        if math.isfinite(seconds):
            return max(seconds, 0.0)
    try:
        date = email.utils.parsedate_to_datetime(headers.get("retry-after") or "")
    except (TypeError, ValueError):
        return None
    return max(date.timestamp() - time.time(), 0.0)


# Error types a server reports in an answer (a stream's error event) for a failure that may pass (Anthropic's,
# OpenAI's), and the others the providers document: only these name the error; any other type is "error".
TRANSIENT_ERROR_TYPES = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error",
                                   "server_error", "rate_limit_exceeded"})
KNOWN_ERROR_TYPES = TRANSIENT_ERROR_TYPES | {"invalid_request_error", "authentication_error", "permission_error",
                                             "not_found_error", "request_too_large", "billing_error",
                                             "insufficient_quota", "context_length_exceeded"}


def _error_in_answer(provider: str, exc) -> ModelError:
    """The ``ModelError`` for an error a server sent inside an answer that began well (status 200): named by the
    error's type when it is one of ``KNOWN_ERROR_TYPES`` (never by other server text: the server's message goes
    in ``detail``, masked and cut by ``server_message``); transient for ``TRANSIENT_ERROR_TYPES``."""
    body = exc.body
    found = body.get("error", body) if isinstance(body, dict) else None
    kind = found.get("type") if isinstance(found, dict) else None
    kind = kind if kind in KNOWN_ERROR_TYPES else "error"
    log.warning("%s error in the answer (%s): %r", provider, kind, body)
    return ModelError(f"{provider} API error in the answer ({kind})", detail=server_message(body),
                      transient=kind in TRANSIENT_ERROR_TYPES)


def _timed_out(exc: BaseException) -> bool:
    """Whether an SDK timeout error was a timeout: the aiohttp transport's error map reports a refused or
    reset connection (an ``aiohttp.ClientConnectionError`` that is no ``TimeoutError``) as a connect timeout."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, TimeoutError):
            return True
        if isinstance(exc, aiohttp.ClientError):
            return False
        exc = exc.__cause__ or exc.__context__
    return True


# The SDKs never retry: a transient error goes back to the caller, which owns retries and backoff.
SDK_MAX_RETRIES = 0


class SDKClientCache:
    """Async SDK clients per (event loop, key, base URL, timeout), reused: each pools its connections.

    A client belongs to the event loop it is first used on: its aiohttp
    session and connections are bound to that loop and cannot be used from another.
    So the running loop is part of the key (held by the cache): two loops,
    at once or in turn (``asyncio.run`` twice), never share a client, and
    the clients of loops that have been closed are dropped whenever a new
    client is made. At most ``max_clients`` are kept; an evicted one is
    closed on its loop ``TOLLGATE["MODEL_CALL_MAX_S"]`` seconds later,
    when no call can be using it any more (``close_all`` closes it sooner
    at exit). Thread-safe.

    A client's ``timeout`` is ``cfg.timeout_s`` for each connect, read and
    connection-pool wait of one call (an ``httpx2.Timeout`` of that many
    seconds, which the aiohttp transport applies as ``sock_connect``,
    ``sock_read`` and ``connect``); it bounds the silence of a server, not
    the length of a streamed answer that keeps arriving. Its ``max_retries`` is
    ``SDK_MAX_RETRIES``.
    """

    def __init__(self, factory, http_client=None, max_clients: int = 16):
        self.factory = factory
        self.http_client = http_client
        self.max_clients = max_clients
        self._clients: dict[tuple, object] = {}
        self._retired: dict[int, tuple] = {}  # id(client) -> (its loop, client): evicted, to be closed
        self._closing: set[asyncio.Task] = set()  # the tasks that close them
        self._lock = threading.Lock()
        atexit.register(self.close_all)

    def close_all(self, timeout_s: float = 2.0) -> None:
        """Close and forget every client whose event loop is still open (at the process's exit: an aiohttp
        session left open is reported as an error when it is collected). A client on a running loop is
        closed on that loop, waiting at most ``timeout_s`` seconds; one on a closed loop is only forgotten."""
        with self._lock:
            clients = [(key[0], client) for key, client in self._clients.items()] + list(self._retired.values())
            self._clients, self._retired = {}, {}
        for loop, client in clients:
            try:
                if loop.is_closed():
                    continue
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(client.close(), loop).result(timeout_s)
                else:
                    loop.run_until_complete(client.close())
            except Exception:  # a client that cannot close now is collected as it is
                log.debug("a model client could not be closed", exc_info=True)

    def get(self, cfg: HttpModelConfig):
        """The client for ``cfg`` on the running event loop, made with ``factory(api_key=, base_url=,
        timeout=, max_retries=)`` and, when the cache has an ``http_client`` factory, ``http_client=http_client()``
        (the SDK's ``DefaultAioHttpClient``). Call it inside a coroutine (``RuntimeError`` without a running loop)."""
        loop = asyncio.get_running_loop()
        key = (loop, cfg.api_key, cfg.base_url, cfg.timeout_s)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                for stale in [k for k in self._clients if k[0].is_closed()]:
                    del self._clients[stale]
                for stale in [k for k, (loop_of, _) in self._retired.items() if loop_of.is_closed()]:
                    del self._retired[stale]
                options = {"api_key": cfg.api_key, "base_url": cfg.base_url, "timeout": cfg.timeout_s,
                           "max_retries": SDK_MAX_RETRIES}
                if self.http_client is not None:
                    options["http_client"] = self.http_client()
                client = self._clients[key] = self.factory(**options)
                while len(self._clients) > self.max_clients:
                    oldest = next(iter(self._clients))
                    self._retire(oldest[0], self._clients.pop(oldest))
            return client

    def _retire(self, loop, client) -> None:
        """Close ``client`` (evicted) on ``loop`` once a call that may still use it is over (lock held)."""
        self._retired[id(client)] = (loop, client)

        async def close_later() -> None:
            await asyncio.sleep(settings.TOLLGATE["MODEL_CALL_MAX_S"])
            with self._lock:
                if self._retired.pop(id(client), None) is None:
                    return  # close_all took it
            try:
                await client.close()
            except Exception:  # collected as it is
                log.debug("an evicted model client could not be closed", exc_info=True)

        def start() -> None:  # on the loop; the task is kept until done (a loop keeps only weak references)
            task = loop.create_task(close_later())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # its loop is closed: nothing can run on it any more
            del self._retired[id(client)]


async def post_json(client, path: str, body: dict, *, stream: bool, sdk):
    """POST ``body`` (JSON-ready: dicts, lists, strings, numbers) to ``path`` of the SDK ``client``'s base URL.

    ``sdk`` is the ``openai`` or ``anthropic`` module. Returns the decoded JSON answer as it came (any JSON
    value), or, with ``stream``, the SDK's ``AsyncStream`` of decoded JSON events (an ``async with`` and
    ``async for`` of dicts, unless the server sent something else). Raises what the SDK raises (its
    ``APIStatusError``, ``APITimeoutError``, ``APIConnectionError``, an ``APIError`` for an error event
    inside a stream; ``httpx2`` transport errors once a stream has begun; an ``aiohttp.ClientResponseError``
    for an HTTP head that does not parse): ``sdk_call`` maps them. This is the SDKs' documented way to send a request with a
    body of one's own (``client.post``); the answer is read with ``json_field``.
    """
    return await client.post(path, body=body, cast_to=object, stream=stream, stream_cls=sdk.AsyncStream[object])


_REQUIRED = object()


def json_field(obj, key: str, kind: type | tuple[type, ...], default=_REQUIRED):
    """``obj[key]`` of a model server's decoded JSON answer, checked: a ``kind`` (``int`` never matches a bool).

    Returns ``default`` when the key is absent or ``null``; raises ``MalformedResponse`` when ``obj`` is not
    a JSON object, when the value has another type, or when it is absent and no ``default`` was given.
    """
    if not isinstance(obj, dict):
        raise MalformedResponse(f"Malformed model response: expected an object holding {key!r}.")
    value = obj.get(key)
    if value is None:
        if default is _REQUIRED:
            raise MalformedResponse(f"Malformed model response: {key!r} is missing.")
        return default
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise MalformedResponse(f"Malformed model response: {key!r} has the wrong type.")
    return value


def _kinds(kind) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


async def read_interruptible(read, stream, request, *, sdk):
    """``await read(stream, request)`` (a ``ModelResponse``); a transport error once the stream has begun (``httpx2``'s, or
    ``sdk.APIConnectionError``) raises a transient ``StreamInterrupted``: half an answer.
    """
    try:
        return await read(stream, request)
    except (httpx2.TransportError, sdk.APIConnectionError) as exc:
        log.warning("response stream broke off: %s", exc)
        raise StreamInterrupted(f"the response stream broke off: {type(exc).__name__}", transient=True) from exc


async def sdk_call(call, *, provider: str, sdk, cfg: HttpModelConfig):
    """``await call()`` (one SDK request and the reading of its answer), mapping errors to ours.

    ``sdk`` is the ``openai`` or ``anthropic`` module. A transport error
    escaping the SDK means the answer broke off (``StreamInterrupted``,
    transient); an error status is a ``ModelError``, ``transient`` for
    ``transient_status`` with ``retry_after_s`` from its headers; a
    timeout or a failed connection is a transient ``ModelError``; an
    answer that cannot be read is ``MalformedResponse``. The messages
    name the error's class and the endpoint profile; the details (which
    may quote the answer) are logged.
    """
    try:
        return await call()
    except httpx2.TransportError as exc:
        log.warning("%s response broke off (endpoint %r): %s", provider, cfg.endpoint, exc)
        raise StreamInterrupted(f"the response broke off: {type(exc).__name__}", transient=True) from exc
    except sdk.APIStatusError as exc:
        if exc.status_code < 400:  # an error event in a stream that began with 200
            raise _error_in_answer(provider, exc) from exc
        log.warning("%s API error %s (endpoint %r): %s %r", provider, exc.status_code, cfg.endpoint, exc.message,
                    exc.body)
        raise ModelError(status_error_message(provider, exc.status_code, type(exc).__name__),
                         detail=server_message(exc.body), status=exc.status_code,
                         transient=transient_status(exc.status_code),
                         retry_after_s=retry_after_seconds(exc.response.headers)) from exc
    except sdk.APIConnectionError as exc:  # APITimeoutError is one
        if isinstance(exc, sdk.APITimeoutError) and _timed_out(exc):
            raise ModelError(f"{provider} API timed out after {cfg.timeout_s}s.", transient=True) from exc
        log.warning("%s API unreachable (endpoint %r): %s", provider, cfg.endpoint, exc)
        raise ModelError(f"{provider} API unreachable (endpoint {cfg.endpoint!r}).", transient=True) from exc
    except sdk.APIError as exc:  # an error object in the answer itself (an OpenAI-compatible stream's chunk)
        raise _error_in_answer(provider, exc) from exc
    except aiohttp.ClientResponseError as exc:  # an answer whose HTTP head does not parse, which an SDK left as it was
        log.warning("unreadable %s answer (endpoint %r): %s", provider, cfg.endpoint, exc)
        raise MalformedResponse(f"Malformed {provider} response: {type(exc).__name__}") from exc
    except (ValueError, TypeError, RecursionError) as exc:  # JSON that does not decode, or nests too deep
        log.warning("malformed %s response", provider, exc_info=True)
        raise MalformedResponse(f"Malformed {provider} response: {type(exc).__name__}") from exc
