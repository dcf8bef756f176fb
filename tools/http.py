"""HTTP tools: a tool whose handler is an endpoint of the integrator's own service.

An operator names the service in an endpoint profile,
``TOLLGATE["TOOL_ENDPOINTS"]`` (``TOLLGATE_TOOL_ENDPOINTS``, JSON)::

    {"bookings": {"base_url": "https://bookings.example.com",   # required: http(s), no user, query or fragment
                  "secret_env": "BOOKINGS_TOOLS_SECRET",        # required: the variable holding the whsec_ secret
                  "allowed_hosts": ["10.1.2.0/24"],             # trusted although loopback/private (urlguard)
                  "allow_private_networks": false,
                  "allow_http": false,
                  "max_response_bytes": 1000000}}

and declares tools on it, in settings (``TOLLGATE["HTTP_TOOLS"]``, a JSON
list of ``http_tool``'s arguments, registered when Django starts) or from
a plug-in's ``AppConfig.ready``: ``register(http_tool(name=..., endpoint=
"bookings", path="/tools/book", ...))``. Nobody else gives a URL.

A call is ``POST {base_url}{path}`` with the JSON body ``{"tool",
"arguments", "idempotency_key", "run_id", "tool_call_id", "session_id"}``,
signed the Standard Webhooks way (``runs.webhooks.delivery.signed_headers``:
``webhook-id`` ``call_<tool call id>_<attempt>``, ``webhook-timestamp``,
``webhook-signature``), under the profile's secret, read from its
environment variable when the call is made (never in settings, events,
logs or errors). The answer:

* 2xx with a JSON body (at most ``max_response_bytes``, matching the
  tool's ``result_schema`` if it has one): the result, the whole body;
* 4xx: a ``ToolError``, a failed call the model is told about, with the
  ``"error"`` string of a JSON body if there is one;
* no connection could be made (refused, timed out, or the name did not
  resolve): ``ToolNotSent``, sent again after a backoff (within
  ``max_attempts``), a side effect too: nothing left;
* 5xx, a connection that broke: ``ToolUnavailable``; no answer within the
  tool's ``timeout_s``: ``ToolTimeout``. The engine retries a read
  (``max_attempts``) and makes a side effect ``unknown``
  (reconciliation; ``tools.services.execution``);
* an answer that cannot be used (larger than the limit, not JSON, not
  matching the result schema, a redirect or other status): a read
  ``failed`` (``ToolError``), a side effect ``unknown`` (``ToolUnavailable``:
  the service answered, so it may have acted).

A connection to an address the guard refuses (``runs.webhooks.urlguard``
under the profile's ``Rules``, checked at start and at each connection)
sends nothing: a ``ToolError``.

A side-effecting tool with a ``reconcile_path`` gets a ``reconcile`` hook:
``POST {base_url}{reconcile_path}`` with ``{"tool", "idempotency_key"}``,
signed the same way (``webhook-id`` ``lookup_<random>``), answered
``{"status": "found", "result": ...}`` (``succeeded`` with that result,
checked like a call's), ``{"status": "not_found"}`` or
``{"status": "unknown"}`` (the service cannot tell yet: asked again
later, never sent again). Any other answer is no answer (the hook raises,
``tools.services.execution.ask_reconcile``).
"""

import asyncio
import functools
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from jsonschema import Draft202012Validator, SchemaError
from standardwebhooks.webhooks import Webhook

from runs.base.masking import mask_log_text
from runs.webhooks.delivery import body_text, signed_headers
from runs.webhooks.urlguard import Rules, UnsafeURL, Unresolvable, check_url, guarded_async_client
from tools.registry import (
    FORMAT_CHECKER, Reconciliation, Tool, ToolContext, ToolError, ToolNotSent, ToolTimeout, ToolUnavailable,
)

log = logging.getLogger(__name__)

USER_AGENT = "Tollgate-Tools/1"
DEFAULT_MAX_RESPONSE_BYTES = 1_000_000
PROFILE_KEYS = {"base_url", "secret_env", "allowed_hosts", "allow_private_networks", "allow_http",
                "max_response_bytes"}
# Keys of a TOLLGATE["HTTP_TOOLS"] entry: http_tool's own, and the Tool fields that settings can express.
TOOL_KEYS = {"name", "description", "parameters", "endpoint", "path", "reconcile_path", "result_schema",
             "side_effect", "approval", "timeout_s", "target_key", "idempotent", "allow_requester_approval",
             "permission", "max_attempts", "backoff_s", "same_action"}
REQUIRED_TOOL_KEYS = ("name", "description", "parameters", "endpoint", "path")
MESSAGE_CHARS = 300  # of a 4xx answer's "error", or a result schema's complaint, told to the model
MAX_CLIENTS = 16  # (event loop, profile) pairs whose client is kept


@dataclass(frozen=True)
class EndpointProfile:
    """One checked profile of ``TOLLGATE["TOOL_ENDPOINTS"]`` (see the module doc); ``base_url`` has no
    trailing slash, ``max_response_bytes`` is in bytes."""

    name: str
    base_url: str
    secret_env: str
    allowed_hosts: tuple[str, ...] = ()
    allow_private_networks: bool = False
    allow_http: bool = False
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    def rules(self) -> Rules:
        """Where this profile's requests may connect (``runs.webhooks.urlguard``)."""
        where = f"its TOLLGATE_TOOL_ENDPOINTS profile {self.name!r}"
        return Rules(allowed_hosts=self.allowed_hosts, allow_private_networks=self.allow_private_networks,
                     allow_http=self.allow_http,
                     hint=f"Tool endpoints go to public addresses only; an operator may trust this one with "
                          f"\"allowed_hosts\" or \"allow_private_networks\" in {where}.",
                     http_refusal=f"Use https://: plain http is off (\"allow_http\" in {where}).")

    def secret(self) -> str:
        """The signing secret, from the environment now. ``ToolError`` when it is gone (nothing is sent)."""
        value = os.environ.get(self.secret_env, "")
        if not value:
            log.warning("tool endpoint %r: the environment variable %s is not set", self.name, self.secret_env)
            raise ToolError(f"The tool endpoint {self.name!r} has no signing secret on this server; nothing was sent.")
        return value


def endpoint_profile(name: str) -> EndpointProfile:
    """The profile ``name`` of ``TOLLGATE["TOOL_ENDPOINTS"]``, checked; ``ImproperlyConfigured`` saying what is wrong.

    Checked: known keys and their types; ``base_url`` an http(s) URL
    without user, query or fragment whose host resolves (DNS, now) only
    to addresses the profile's rules allow; ``secret_env`` names a set
    environment variable holding a Standard Webhooks secret (``whsec_`` and
    base64). Messages name the variable, never its value.
    """
    profiles = settings.TOLLGATE.get("TOOL_ENDPOINTS") or {}
    if not isinstance(profiles, dict):
        raise ImproperlyConfigured("TOLLGATE_TOOL_ENDPOINTS must be a JSON object of endpoint profiles.")
    where = f"TOLLGATE_TOOL_ENDPOINTS[{name!r}]"
    raw = profiles.get(name)
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"Unknown tool endpoint {name!r}; known: {', '.join(sorted(profiles)) or 'none'} "
                                   f"(TOLLGATE_TOOL_ENDPOINTS).")
    if unknown := sorted(set(raw) - PROFILE_KEYS):
        raise ImproperlyConfigured(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(PROFILE_KEYS))}.")
    hosts, size = raw.get("allowed_hosts", []), raw.get("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES)
    if not isinstance(hosts, list) or not all(isinstance(host, str) for host in hosts):
        raise ImproperlyConfigured(f"{where}: \"allowed_hosts\" must be a list of host names and addresses.")
    if any(not isinstance(raw.get(key, False), bool) for key in ("allow_private_networks", "allow_http")):
        raise ImproperlyConfigured(f"{where}: \"allow_private_networks\" and \"allow_http\" are true or false.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ImproperlyConfigured(f"{where}: \"max_response_bytes\" must be a whole number of bytes, at least 1.")
    base_url = raw.get("base_url")
    try:
        parts = urlsplit(base_url) if isinstance(base_url, str) else None
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.query or parts.fragment:
        raise ImproperlyConfigured(f"{where}: \"base_url\" must be an http:// or https:// URL without query or fragment.")
    profile = EndpointProfile(name=name, base_url=base_url.rstrip("/"), secret_env=raw.get("secret_env"),
                              allowed_hosts=tuple(hosts), allow_private_networks=raw.get("allow_private_networks", False),
                              allow_http=raw.get("allow_http", False), max_response_bytes=size)
    try:
        check_url(profile.base_url, profile.rules())
    except UnsafeURL as exc:
        raise ImproperlyConfigured(f"{where}: \"base_url\" is refused. {exc.message}") from None
    _check_secret(profile, where)
    return profile


def check_endpoints() -> None:
    """Check every profile of ``TOLLGATE["TOOL_ENDPOINTS"]`` (``endpoint_profile``), used by a tool or not.

    Raises ``ImproperlyConfigured`` for the first that is wrong; called when Django starts.
    """
    profiles = settings.TOLLGATE.get("TOOL_ENDPOINTS") or {}
    for name in profiles if isinstance(profiles, dict) else [None]:
        endpoint_profile(name)


def _check_secret(profile: EndpointProfile, where: str) -> None:
    """``ImproperlyConfigured`` unless ``profile.secret_env`` names a set variable holding a ``whsec_`` secret."""
    if not isinstance(profile.secret_env, str) or not profile.secret_env:
        raise ImproperlyConfigured(f"{where}: \"secret_env\" must name the environment variable holding the "
                                   "signing secret.")
    value = os.environ.get(profile.secret_env, "")
    if not value:
        raise ImproperlyConfigured(f"{where}: the environment variable {profile.secret_env} (its \"secret_env\") "
                                   "is not set.")
    try:
        Webhook(value)
        valid = value.startswith("whsec_")
    except Exception:  # the library's errors for a secret that is empty or not base64
        valid = False
    if not valid:
        raise ImproperlyConfigured(f"{where}: the environment variable {profile.secret_env} does not hold a "
                                   "Standard Webhooks secret (whsec_ followed by base64).")


@dataclass(frozen=True, eq=False)
class _Remote:
    """Where one HTTP tool's calls go and how their answers are read (the ``http_tool`` arguments)."""

    tool: str
    profile: EndpointProfile
    path: str
    reconcile_path: str
    side_effect: bool
    timeout_s: float
    result_validator: Draft202012Validator | None


def http_tool(*, name: str, description: str, parameters: dict, endpoint: str, path: str,
              reconcile_path: str = "", result_schema: dict | None = None, **fields) -> Tool:
    """A ``Tool`` whose handler POSTs to ``path`` of the endpoint profile ``endpoint`` (see the module doc).

    ``parameters``: JSON Schema of the arguments; ``path`` / ``reconcile_path``:
    paths under the profile's ``base_url``, starting with ``/``
    (``reconcile_path`` only for ``side_effect=True``: the lookup by
    idempotency key); ``result_schema``: JSON Schema a 2xx answer's body
    must match. ``fields``: any other ``Tool`` field (``side_effect``,
    ``approval``, ``timeout_s`` in seconds, ``target_key``, ``idempotent``...;
    not ``handler`` or ``reconcile``). Raises ``ImproperlyConfigured``
    (the profile as ``endpoint_profile`` checks it, a path, a schema).
    Register the result with ``tools.registry.register``.
    """
    side_effect = fields.get("side_effect", Tool.side_effect)
    for key, value in (("path", path), ("reconcile_path", reconcile_path)):
        if not isinstance(value, str) or (value and not value.startswith("/")) or (key == "path" and not value):
            raise ImproperlyConfigured(f"tool {name}: {key} must be a path starting with '/'.")
    if reconcile_path and not side_effect:
        raise ImproperlyConfigured(f"tool {name}: only a side-effecting tool is reconciled; reconcile_path "
                                   "needs side_effect=True.")
    try:
        if result_schema is not None:
            Draft202012Validator.check_schema(result_schema)
    except SchemaError as exc:
        raise ImproperlyConfigured(f"tool {name}: result_schema is not a JSON Schema: {exc.message}") from None
    validator = None if result_schema is None else Draft202012Validator(result_schema, format_checker=FORMAT_CHECKER)
    remote = _Remote(tool=name, profile=endpoint_profile(endpoint), path=path, reconcile_path=reconcile_path,
                     side_effect=side_effect, timeout_s=fields.get("timeout_s", Tool.timeout_s),
                     result_validator=validator)
    return Tool(name=name, description=description, parameters=parameters, handler=functools.partial(_call, remote),
                reconcile=functools.partial(_look_up, remote) if reconcile_path else None,
                location=f"HTTP {endpoint} {path}", **fields)


def tools_from_settings() -> list[Tool]:
    """The tools ``TOLLGATE["HTTP_TOOLS"]`` declares (a list of ``http_tool`` arguments), each checked.

    Raises ``ImproperlyConfigured`` naming the entry and what is wrong with it.
    """
    entries = settings.TOLLGATE.get("HTTP_TOOLS") or []
    if not isinstance(entries, list):
        raise ImproperlyConfigured("TOLLGATE_HTTP_TOOLS must be a JSON list of tools.")
    tools = []
    for index, entry in enumerate(entries):
        where = f"TOLLGATE_HTTP_TOOLS[{index}]"
        if not isinstance(entry, dict):
            raise ImproperlyConfigured(f"{where} must be an object.")
        where += f" ({entry.get('name')!r})" if "name" in entry else ""
        if missing := [key for key in REQUIRED_TOOL_KEYS if key not in entry]:
            raise ImproperlyConfigured(f"{where}: missing {', '.join(missing)}.")
        if unknown := sorted(set(entry) - TOOL_KEYS):
            raise ImproperlyConfigured(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(TOOL_KEYS))}.")
        try:
            tools.append(http_tool(**entry))
        except (ImproperlyConfigured, SchemaError, ValueError, TypeError) as exc:
            message = exc.message if isinstance(exc, SchemaError) else str(exc)
            raise ImproperlyConfigured(f"{where}: {message}") from None
    return tools


_clients: dict[tuple, httpx.AsyncClient] = {}
_clients_lock = threading.Lock()


def _client(profile: EndpointProfile) -> httpx.AsyncClient:
    """The pooled, guarded client of ``profile`` on the running event loop (made on first use).

    A client's connections belong to its loop, so the loop is part of the
    key (held, so its id is never reused); the clients of closed loops are
    dropped whenever one is made, and at most ``MAX_CLIENTS`` are kept.
    """
    key = (asyncio.get_running_loop(), profile)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            for stale in [k for k in _clients if k[0].is_closed()]:
                del _clients[stale]
            client = _clients[key] = guarded_async_client(profile.rules(), headers={"user-agent": USER_AGENT})
            while len(_clients) > MAX_CLIENTS:
                del _clients[next(iter(_clients))]
        return client


class _Unusable(Exception):
    """An answer that came but cannot be used (too large, not JSON, off the result schema, an odd status)."""


async def _post(remote: _Remote, path: str, payload: dict, message_id: str) -> tuple[int, bytes]:
    """POST ``payload`` signed to ``path`` of ``remote``'s profile: ``(status, body)``, the body read raw.

    Raises ``ToolError`` (nothing sent: no secret, or a refused address),
    ``ToolTimeout`` (no answer within ``timeout_s`` seconds),
    ``ToolNotSent`` (no connection could be made: refused, timed out, or
    the name did not resolve), ``ToolUnavailable``
    (the connection broke) and ``_Unusable``
    (a body over ``max_response_bytes``).
    """
    profile = remote.profile
    body = body_text(payload)
    headers = {"content-type": "application/json", "accept": "application/json", "accept-encoding": "identity",
               **signed_headers(secret=profile.secret(), webhook_id=message_id, body=body, timestamp=int(time.time()))}
    try:
        async with _client(profile).stream("POST", profile.base_url + path, content=body.encode(), headers=headers,
                                           timeout=httpx.Timeout(remote.timeout_s)) as response:
            chunks, size = [], 0
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if size > profile.max_response_bytes:
                    raise _Unusable(f"the answer is larger than {profile.max_response_bytes} bytes")
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)
    except Unresolvable as exc:  # DNS failed, perhaps for a while: no connection, the request never left
        log.warning("tool %s: endpoint %r: %s", remote.tool, profile.name, exc.message)
        raise ToolNotSent("The tool's service could not be reached (its name did not resolve); nothing was sent.") \
            from None
    except UnsafeURL as exc:
        log.warning("tool %s: endpoint %r refused: %s", remote.tool, profile.name, exc.message)
        raise ToolError("The tool's endpoint is at an address this server may not call; nothing was sent.") from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # no connection: the request never left
        log.warning("tool %s: endpoint %r: %r", remote.tool, profile.name, exc)
        raise ToolNotSent(f"The tool's service could not be reached ({type(exc).__name__}); nothing was sent.") \
            from None
    except httpx.TimeoutException:
        raise ToolTimeout(f"No answer within {remote.timeout_s:g} s.") from None
    except httpx.HTTPError as exc:
        log.warning("tool %s: endpoint %r: %r", remote.tool, profile.name, exc)
        raise ToolUnavailable(f"The tool's service could not be reached ({type(exc).__name__}).") from None


def _json(body: bytes):
    """The JSON value in ``body`` (strict: no NaN or Infinity); ``_Unusable`` if it is not JSON."""
    def refuse(constant):
        raise _Unusable(f"the answer is not strict JSON ({constant})")

    try:
        return json.loads(body, parse_constant=refuse)
    except (ValueError, RecursionError):
        raise _Unusable("the answer is not JSON") from None


def _checked_result(remote: _Remote, value):
    """``value`` if it matches the tool's result schema (or there is none); else ``_Unusable`` saying where not."""
    error = remote.result_validator and next(remote.result_validator.iter_errors(value), None)
    if error:
        at = "/".join(str(part) for part in error.absolute_path) or "(root)"
        raise _Unusable(f"the answer does not match the tool's result schema ({at}: {error.message})"[:MESSAGE_CHARS])
    return value


async def _call(remote: _Remote, ctx: ToolContext, arguments: dict):
    """An HTTP tool's handler: POST the call, signed, and read the answer (the module doc says how)."""
    call = ctx.tool_call
    payload = {"tool": remote.tool, "arguments": arguments, "idempotency_key": ctx.idempotency_key,
               "run_id": ctx.run.pk, "tool_call_id": call.pk, "session_id": ctx.run.session_id}
    try:
        status, body = await _post(remote, remote.path, payload, f"call_{call.pk}_{call.attempts}")
        if 200 <= status < 300:
            return _checked_result(remote, _json(body))
        if 400 <= status < 500:
            raise ToolError(_refusal(status, body))
        if status >= 500:
            raise ToolUnavailable(f"The tool's service answered HTTP {status}.")
        raise _Unusable(f"the service answered HTTP {status}")
    except _Unusable as exc:
        log.warning("tool %s: unusable answer from endpoint %r: %s", remote.tool, remote.profile.name, exc)
        message = f"The tool's service answered, but {exc}."
        # The service answered: a side effect may have happened (unknown, then reconciled); a read just failed.
        raise (ToolUnavailable if remote.side_effect else ToolError)(message) from None


def _refusal(status: int, body: bytes) -> str:
    """What the model is told of a 4xx answer: the status, and the ``"error"`` string of a JSON body (masked, cut)."""
    try:
        said = json.loads(body).get("error")
    except (ValueError, AttributeError, RecursionError):
        said = None
    text = f"The tool's service refused the call (HTTP {status})"
    if isinstance(said, str) and said.strip():
        said = mask_log_text(said.strip()).replace("\x00", "\ufffd")
        text += ": " + (said if len(said) <= MESSAGE_CHARS else said[: MESSAGE_CHARS - 1] + "…")
    return text if text.endswith((".", "!", "?", "…")) else text + "."


async def _look_up(remote: _Remote, idempotency_key: str) -> Reconciliation:
    """An HTTP tool's ``reconcile`` hook: ask the service what became of the call sent under ``idempotency_key``.

    Returns ``succeeded`` (``found``, with its result, checked as a
    call's), ``not_found``, or ``not_found`` with an error (``unknown``: the
    service cannot tell yet). Raises ``ToolError`` / ``ToolUnavailable``
    for any other answer (the engine counts it as a try that learned nothing).
    """
    payload = {"tool": remote.tool, "idempotency_key": idempotency_key}
    try:
        status, body = await _post(remote, remote.reconcile_path, payload, f"lookup_{secrets.token_hex(12)}")
        if not 200 <= status < 300:
            raise ToolUnavailable(f"The tool's service answered the lookup with HTTP {status}.")
        answer = _json(body)
        found = answer.get("status") if isinstance(answer, dict) else None
        if found == "found" and "result" in answer:
            return Reconciliation("succeeded", result=_checked_result(remote, answer["result"]))
        if found == "not_found":
            return Reconciliation("not_found")
        if found == "unknown":
            return Reconciliation("not_found", error="The tool's service cannot tell yet what became of the call.")
        raise _Unusable('the answer is not {"status": "found", "result": ...}, "not_found" or "unknown"')
    except _Unusable as exc:
        log.warning("tool %s: unusable lookup answer from endpoint %r: %s", remote.tool, remote.profile.name, exc)
        raise ToolUnavailable(f"The tool's service answered the lookup, but {exc}.") from None
