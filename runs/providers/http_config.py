"""The config shared by the HTTP providers (``openai``, ``anthropic``).

An agent's ``model`` JSON for these providers::

    {"provider": "openai" | "anthropic",
     "model": str,                  # the provider's model name (required)
     "base_url": str?,              # e.g. "http://localhost:11434/v1" for Ollama
     "api_key_env": str?,           # NAME of the environment variable with the key
     "stream": bool = true,
     "temperature": float?,
     "max_output_tokens": int?,     # anthropic: default TOLLGATE["DEFAULT_MAX_OUTPUT_TOKENS"]
     "timeout_s": float?,           # per HTTP attempt; default TOLLGATE["MODEL_TIMEOUT_S"]
     "max_retries": int?,           # SDK retries; default TOLLGATE["MODEL_MAX_RETRIES"]
     "context_window": int?}        # tokens; see runs.context

``api_key_env`` defaults to ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY``.
When it is not given and ``base_url`` is (a local OpenAI-compatible server
that needs no key), an unset variable is fine and a placeholder key is
sent. Anything else wrong raises ``ConfigError`` (the run fails with
``model_error`` before any request leaves).
"""

import logging
import os
import threading
from dataclasses import dataclass

import httpx
from django.conf import settings

from runs.providers.base import ConfigError, MalformedResponse, ModelError, StreamInterrupted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpModelConfig:
    provider: str
    model: str
    api_key: str
    base_url: str | None
    stream: bool
    temperature: float | None
    max_output_tokens: int | None
    timeout_s: float
    max_retries: int


def parse_config(config: dict, *, default_key_env: str) -> HttpModelConfig:
    """Validate an agent's model config. Raises ``ConfigError`` naming the bad key."""
    provider = config.get("provider", "")
    model = config.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"The {provider} model config needs a 'model' name.")
    base_url = config.get("base_url") or None
    if base_url is not None and not isinstance(base_url, str):
        raise ConfigError("'base_url' must be a string.")
    key_env = config.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not key_env):
        raise ConfigError("'api_key_env' must be the name of an environment variable.")
    api_key = os.environ.get(key_env or default_key_env, "")
    if not api_key:
        if key_env or base_url is None:
            raise ConfigError(f"The environment variable {key_env or default_key_env} (api_key_env) is not set.")
        api_key = "unused"
    stream = config.get("stream", True)
    if not isinstance(stream, bool):
        raise ConfigError("'stream' must be true or false.")
    return HttpModelConfig(
        provider=provider,
        model=model,
        api_key=api_key,
        base_url=base_url,
        stream=stream,
        temperature=_number(config, "temperature", float, None),
        max_output_tokens=_number(config, "max_output_tokens", int, None),
        timeout_s=_number(config, "timeout_s", float, settings.TOLLGATE["MODEL_TIMEOUT_S"]),
        max_retries=_number(config, "max_retries", int, settings.TOLLGATE["MODEL_MAX_RETRIES"]),
    )


def _number(config: dict, key: str, kind: type, default):
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ConfigError(f"'{key}' must be a {'whole ' if kind is int else ''}number.")
    if value < 0:
        raise ConfigError(f"'{key}' must not be negative.")
    return kind(value)


def status_error_message(provider: str, status: int, body, fallback: str, retries: int) -> str:
    """A one-line error for an HTTP error answer, with the provider's own message.

    ``body`` is the parsed error body (OpenAI ``{"error": {"message"}}``,
    Anthropic ``{"type": "error", "error": {"type", "message"}}``) or None.
    """
    detail = fallback
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            detail = str(error["message"])
            if error.get("type"):
                detail = f"{error['type']}: {detail}"
        elif isinstance(error, str):
            detail = error
    retried = status == 429 or status >= 500 or status in (408, 409)
    suffix = f" (gave up after {retries} retries)" if retried and retries else ""
    return f"{provider} API error {status}: {detail}{suffix}"


def normalise_finish_reason(raw: str | None, table: dict[str, str], calls: list[dict]) -> str:
    """Map a provider's finish/stop reason through ``table`` to ``stop`` | ``tool_calls`` | ``length``.

    Some compatible servers answer ``stop`` although they returned tool
    calls; the calls decide then. Unknown reasons count as ``stop``.
    """
    normalised = table.get(raw or "", "stop")
    if normalised == "stop" and calls:
        return "tool_calls"
    return normalised


class SDKClientCache:
    """SDK clients per (key, base URL, timeout, retries), reused: each pools its connections.

    At most ``max_clients`` are kept; an evicted one is closed by the
    garbage collector once no call uses it any more. Thread-safe.
    """

    def __init__(self, factory, max_clients: int = 16):
        self.factory = factory
        self.max_clients = max_clients
        self._clients: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def get(self, cfg: HttpModelConfig):
        """The client for ``cfg``, made with ``factory(api_key=, base_url=, timeout=, max_retries=)``."""
        key = (cfg.api_key, cfg.base_url, cfg.timeout_s, cfg.max_retries)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = self.factory(
                    api_key=cfg.api_key, base_url=cfg.base_url, timeout=cfg.timeout_s, max_retries=cfg.max_retries)
                while len(self._clients) > self.max_clients:
                    del self._clients[next(iter(self._clients))]
            return client


def read_interruptible(read, stream, request, *, connection_errors: tuple):
    """``read(stream, request)``, turning a connection lost mid-stream into ``StreamInterrupted``.

    The response has begun (the SDK returned ``stream``), so any transport
    error from here on means half an answer: httpx's own errors, or the
    SDK's ``connection_errors`` wrapping them.
    """
    try:
        return read(stream, request)
    except (httpx.TransportError, *connection_errors) as exc:
        raise StreamInterrupted(f"the response stream broke off: {type(exc).__name__}: {exc}") from exc


def sdk_call(call, *, provider: str, sdk, transport_errors: tuple, cfg: HttpModelConfig, base_url):
    """Run ``call()`` (one SDK request and the reading of its answer), mapping errors to ours.

    ``sdk`` is the ``openai`` or ``anthropic`` module. A transport error
    escaping the SDK means the answer broke off (``StreamInterrupted``);
    status, timeout and connection errors (after the SDK's own retries)
    are ``ModelError``; an answer that cannot be read is
    ``MalformedResponse``.
    """
    try:
        return call()
    except transport_errors as exc:
        raise StreamInterrupted(f"the response broke off: {type(exc).__name__}: {exc}") from exc
    except sdk.APIStatusError as exc:
        raise ModelError(status_error_message(provider, exc.status_code, exc.body, exc.message,
                                              cfg.max_retries)) from exc
    except sdk.APITimeoutError as exc:
        raise ModelError(f"{provider} API timed out after {cfg.timeout_s}s "
                         f"(gave up after {cfg.max_retries} retries).") from exc
    except sdk.APIConnectionError as exc:
        raise ModelError(f"{provider} API unreachable at {base_url}: {exc} "
                         f"(gave up after {cfg.max_retries} retries).") from exc
    except (sdk.APIResponseValidationError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("malformed %s response", provider, exc_info=True)
        raise MalformedResponse(f"Malformed {provider} response: {type(exc).__name__}: {exc}") from exc
