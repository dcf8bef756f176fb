"""Server profiles: ``TOLLGATE["MCP_SERVERS"]`` read and checked (shapes only; URL rules: ``tools.mcp.startup``)."""

import functools
import json
import os
import re
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tools.policy import InvalidRule, check_rule

SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
KNOWN_KEYS = {"url", "auth_header_env", "auth_header", "timeout_s", "rules", "max_attempts", "backoff_s"}
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_S = 1.0


@dataclass(frozen=True)
class ServerProfile:
    """One MCP server an operator configured.

    ``name``: the prefix agents use (``name.tool``); ``url``: its Streamable
    HTTP endpoint; ``auth_header`` / ``auth_header_env``: the header sent
    with every request and the environment variable holding its value
    (empty: no header); ``timeout_s``: seconds a call may take;
    ``max_attempts`` / ``backoff_s``: how often a read-only call is sent
    while the server cannot be reached, with exponential backoff from
    ``backoff_s`` seconds (full jitter); ``rules``: ``{tool name: approval rule}`` set by the operator, replacing
    what the tool's annotations would ask (``tools.policy`` syntax).
    """

    name: str
    url: str
    auth_header: str = "Authorization"
    auth_header_env: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_s: float = DEFAULT_BACKOFF_S
    rules: dict = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        """The headers every request carries: the auth header read from the environment now.

        Raises ``ImproperlyConfigured`` when the variable is not set. The
        value is never logged, stored or shown.
        """
        if not self.auth_header_env:
            return {}
        value = os.environ.get(self.auth_header_env)
        if not value:
            raise ImproperlyConfigured(f"MCP server {self.name}: the environment variable {self.auth_header_env} "
                                       "(its auth header) is not set.")
        return {self.auth_header: value}


def servers() -> dict[str, ServerProfile]:
    """The configured servers by name, from ``TOLLGATE["MCP_SERVERS"]`` as it is now.

    Raises ``ImproperlyConfigured`` naming the server and the problem for
    a malformed profile (unknown key, bad name, URL, timeout or rule).
    """
    return _parse(json.dumps(settings.TOLLGATE.get("MCP_SERVERS") or {}, sort_keys=True))


@functools.lru_cache(maxsize=8)
def _parse(raw: str) -> dict[str, ServerProfile]:
    configured = json.loads(raw)
    if not isinstance(configured, dict):
        raise ImproperlyConfigured("TOLLGATE_MCP_SERVERS must be a JSON object of server profiles by name.")
    return {name: _profile(name, entry) for name, entry in configured.items()}


def _profile(name: str, entry) -> ServerProfile:
    def bad(problem: str) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"TOLLGATE_MCP_SERVERS: server {name!r}: {problem}")

    if not SERVER_NAME.match(name):
        raise bad("a name is 1 to 32 lowercase letters, digits, '_' or '-' (no '.': agents write server.tool).")
    if not isinstance(entry, dict):
        raise bad("a profile is an object with at least a url.")
    unknown = set(entry) - KNOWN_KEYS
    if unknown:
        raise bad(f"unknown keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}.")
    url = entry.get("url")
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise bad("url must be an http:// or https:// URL.")
    timeout_s = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 3600:
        raise bad("timeout_s must be a number of seconds from 0 to 3600.")
    max_attempts = entry.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 20:
        raise bad("max_attempts must be an integer from 1 to 20.")
    backoff_s = entry.get("backoff_s", DEFAULT_BACKOFF_S)
    if isinstance(backoff_s, bool) or not isinstance(backoff_s, (int, float)) or not 0 < backoff_s <= 600:
        raise bad("backoff_s must be a number of seconds from 0 to 600.")
    rules = entry.get("rules", {})
    if not isinstance(rules, dict):
        raise bad("rules must be an object of approval rules by tool name.")
    for tool, rule in rules.items():
        try:
            check_rule(rule if isinstance(rule, str) else "", target_key="")
        except InvalidRule as exc:
            raise bad(f"rule for {tool}: {exc}") from None
    for key in ("auth_header_env", "auth_header"):
        if not isinstance(entry.get(key, ""), str):
            raise bad(f"{key} must be a string.")
    return ServerProfile(name=name, url=url, auth_header=entry.get("auth_header") or "Authorization",
                         auth_header_env=entry.get("auth_header_env", ""), timeout_s=float(timeout_s),
                         max_attempts=max_attempts, backoff_s=float(backoff_s), rules=dict(rules))
