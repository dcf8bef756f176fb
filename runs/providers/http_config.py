"""The config shared by the HTTP providers (``openai``, ``anthropic``).

An agent's ``model`` JSON for these providers::

    {"provider": "openai" | "anthropic",
     "model": str,                  # the provider's model name (required)
     "endpoint": str?,              # a profile in TOLLGATE["MODEL_ENDPOINTS"]; default: the provider's name
     "stream": bool = true,
     "temperature": float?,
     "max_output_tokens": int?,     # anthropic: default TOLLGATE["DEFAULT_MAX_OUTPUT_TOKENS"]
     "timeout_s": float?,           # seconds, > 0; default TOLLGATE["MODEL_TIMEOUT_S"] (sdk_calls.SDKClientCache)
     "max_retries": int?,           # the caller's retries of a transient error; default TOLLGATE["MODEL_MAX_RETRIES"]
     "context_window": int?}        # tokens; see runs.engine.context

Where a request goes and with which key is the operator's choice, not the
agent's: ``TOLLGATE["MODEL_ENDPOINTS"]`` maps profile names to
``{"provider", "base_url"?, "api_key_env"?}`` (``api_key_env`` names the
environment variable holding the key; default ``OPENAI_API_KEY`` /
``ANTHROPIC_API_KEY``). A profile with a ``base_url`` and no
``api_key_env`` is a local server that needs no key. An agent config may
carry its own ``base_url`` / ``api_key_env`` only where
``TOLLGATE["ALLOW_AGENT_ENDPOINTS"]`` is on (off by default): otherwise an
agent could send any server variable to any host.

``config_problems`` checks a config without touching the environment
(agent creation); ``parse_config`` resolves it for a call and raises
``ConfigError`` (the run fails with ``model_error`` before any request
leaves). Error texts never contain a key, an environment variable's value
or a provider's answer body: those are logged; of an error answer the run
keeps its status and the server's message (``sdk_calls.server_message``).

Calls are made through ``runs.providers.sdk_calls``.
"""

import logging
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.translation import gettext as _

from runs.base.model_call import ConfigError

log = logging.getLogger(__name__)
# Keys that name where requests go; allowed in an agent only with ALLOW_AGENT_ENDPOINTS.
RAW_ENDPOINT_KEYS = ("base_url", "api_key_env")
KNOWN_KEYS = {"provider", "model", "endpoint", *RAW_ENDPOINT_KEYS, "stream", "temperature", "max_output_tokens",
              "timeout_s", "max_retries", "context_window"}
_NUMBERS = {"temperature": float, "max_output_tokens": int, "timeout_s": float, "max_retries": int,
            "context_window": int}


@dataclass(frozen=True)
class HttpModelConfig:
    provider: str
    model: str
    endpoint: str
    api_key: str
    base_url: str | None
    stream: bool
    temperature: float | None
    max_output_tokens: int | None
    timeout_s: float
    max_retries: int


def _profiles() -> dict:
    return settings.TOLLGATE.get("MODEL_ENDPOINTS") or {}


def _known() -> str:
    """The endpoint profiles' names for a message, or "none"."""
    return ", ".join(sorted(_profiles())) or "none"


def _url_problem(url) -> str | None:
    if not isinstance(url, str):
        return _("'base_url' must be a string.")
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return _("'base_url' must be an http:// or https:// URL.")
    return None


def config_problems(config: dict) -> list[str]:
    """Problems with an HTTP provider's model ``config`` (a dict), checked without the environment.

    Returns a list of messages, empty when the config can be used: a
    model name, a known endpoint profile of the same provider (or, only
    with ``ALLOW_AGENT_ENDPOINTS``, a well-formed ``base_url`` /
    ``api_key_env``), no unknown keys, and numbers of the right kind.
    """
    provider = config.get("provider", "")
    problems = []
    unknown = sorted(str(key) for key in set(config) - KNOWN_KEYS)
    if unknown:
        problems.append(_("Unknown key(s) in the model config: %(keys)s.") % {"keys": ", ".join(unknown)})
    model = config.get("model")
    if not isinstance(model, str) or not model:
        problems.append(_("The %(provider)s model config needs a 'model' name.") % {"provider": provider})
    raw = [key for key in RAW_ENDPOINT_KEYS if key in config]
    if raw and not settings.TOLLGATE.get("ALLOW_AGENT_ENDPOINTS"):
        problems.append(_("%(keys)s may not be set in an agent: name an endpoint profile with 'endpoint' "
                          "(known: %(known)s).") % {"keys": " and ".join(repr(k) for k in raw), "known": _known()})
    elif raw:
        if "endpoint" in config:
            problems.append(_("Give either 'endpoint' or 'base_url'/'api_key_env', not both."))
        if "base_url" in config and (problem := _url_problem(config["base_url"])):
            problems.append(problem)
        key_env = config.get("api_key_env")
        if "api_key_env" in config and (not isinstance(key_env, str) or not key_env):
            problems.append(_("'api_key_env' must be the name of an environment variable."))
    if not raw or "endpoint" in config:
        name = config.get("endpoint", provider)
        profile = _profiles().get(name) if isinstance(name, str) else None
        if not isinstance(profile, dict):
            problems.append(_("Unknown model endpoint %(name)s; known: %(known)s.")
                            % {"name": repr(name), "known": _known()})
        elif profile.get("provider") != provider:
            problems.append(_("The model endpoint %(name)s is for provider %(other)s, not %(provider)s.") % {
                "name": repr(name), "other": repr(profile.get("provider")), "provider": repr(provider)})
    if "stream" in config and not isinstance(config["stream"], bool):
        problems.append(_("'stream' must be true or false."))
    for key, kind in _NUMBERS.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            message = _("'%(key)s' must be a whole number.") if kind is int else _("'%(key)s' must be a number.")
            problems.append(message % {"key": key})
        elif value < 0:
            problems.append(_("'%(key)s' must not be negative.") % {"key": key})
        elif value == 0 and key == "timeout_s":  # the transport would read 0 as no timeout at all
            problems.append(_("'%(key)s' must be greater than 0.") % {"key": key})
    return problems


def _endpoint(config: dict, provider: str) -> tuple[str, str | None, str | None]:
    """(profile name, base URL, key variable) for a checked config."""
    if any(key in config for key in RAW_ENDPOINT_KEYS):
        return "agent config", config.get("base_url") or None, config.get("api_key_env")
    name = config.get("endpoint", provider)
    profile = _profiles()[name]
    return name, profile.get("base_url") or None, profile.get("api_key_env")


def parse_config(config: dict, *, default_key_env: str) -> HttpModelConfig:
    """Resolve an agent's model config through its endpoint profile, for one call.

    Raises ``ConfigError`` for the first of ``config_problems`` and when
    the key's environment variable is unset (the variable is named in the
    log only).
    """
    problems = config_problems(config)
    if problems:
        raise ConfigError(problems[0])
    provider = config.get("provider", "")
    endpoint, base_url, key_env = _endpoint(config, provider)
    api_key = os.environ.get(key_env or default_key_env, "")
    if not api_key:
        if key_env or base_url is None:
            log.warning("model endpoint %r: the environment variable %s is not set", endpoint,
                        key_env or default_key_env)
            raise ConfigError(f"The model endpoint {endpoint!r} has no API key configured on this server.")
        api_key = "unused"
    timeout_s = _number(config, "timeout_s", float, settings.TOLLGATE["MODEL_TIMEOUT_S"])
    if not timeout_s > 0:  # the operator's default (an agent's own is checked above): 0 would mean no timeout at all
        raise ConfigError("The model timeout (TOLLGATE_MODEL_TIMEOUT_S) must be greater than 0.")
    return HttpModelConfig(
        provider=provider,
        model=config["model"],
        endpoint=endpoint,
        api_key=api_key,
        base_url=base_url,
        stream=config.get("stream", True),
        temperature=_number(config, "temperature", float, None),
        max_output_tokens=_number(config, "max_output_tokens", int, None),
        timeout_s=timeout_s,
        max_retries=_number(config, "max_retries", int, settings.TOLLGATE["MODEL_MAX_RETRIES"]),
    )


def _number(config: dict, key: str, kind: type, default):
    value = config.get(key)
    return default if value is None else kind(value)


def normalise_finish_reason(raw: str | None, table: dict[str, str], calls: list[dict]) -> str:
    """Map a provider's finish/stop reason through ``table`` to ``stop`` | ``tool_calls`` | ``length``.

    Some compatible servers answer ``stop`` although they returned tool
    calls; the calls decide then. Unknown reasons count as ``stop``.
    """
    normalised = table.get(raw or "", "stop")
    if normalised == "stop" and calls:
        return "tool_calls"
    return normalised
