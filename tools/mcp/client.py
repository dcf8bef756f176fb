"""One connection to an MCP server with the official SDK (Streamable HTTP), its failures as registry errors.

Each listing or call opens its own connection (``connected``): a worker
holds nothing open between calls, and a server restarted meanwhile is
simply connected to again. Failures are sorted the engine's way:

* the server could not be reached before the call was sent (its name
  did not resolve, too): ``ToolNotSent`` (the engine sends any call again after a backoff);
* the connection broke, or no answer came in time: ``ToolUnavailable``
  (the engine retries a read-only or idempotent call with backoff; a
  side-effecting one becomes ``unknown``);
* the server answered with a protocol error (unknown tool, bad
  arguments...): ``ToolError``, a failed call the model is told about.

Every connection goes through the webhooks' address guard
(``runs.webhooks.urlguard.connect_checked`` under the webhooks' rules, as
the start-up check of the profile's URL): the server's name is resolved and
checked at each connection, and only a checked address is connected to, so
a name that later resolves to a refused address (DNS rebinding), or a
redirect the SDK follows within the server's origin, reaches nothing
refused. No proxy or certificate settings come from the environment. A
refused address before the session is open is a ``ToolError`` (nothing
was sent); later, ``ToolUnavailable`` (the call may have been sent).
"""

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpcore2
import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import StreamableHTTPError, streamable_http_client
from mcp.types import CallToolResult, Implementation, Tool as ListedTool
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from django.core.exceptions import ImproperlyConfigured

from runs.webhooks.urlguard import POOL, UnsafeURL, Unresolvable, connect_checked
from tools.mcp.conf import ServerProfile
from tools.registry import ToolError, ToolNotSent, ToolUnavailable

log = logging.getLogger(__name__)
CLIENT_INFO = Implementation(name="tollgate", version="1")
MAX_LISTING_PAGES = 20


class GuardedBackend(httpcore2.AnyIOBackend):
    """httpcore2's network backend (the SDK's HTTP stack), every TCP connection opened by
    ``runs.webhooks.urlguard.connect_checked`` under the webhooks' rules (read at each connection)."""

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        connect = super().connect_tcp
        return await connect_checked(host, port, None, lambda address: connect(
            address, port, timeout=timeout, local_address=local_address, socket_options=socket_options),
            httpcore2.ConnectError)


def guarded_http_client(headers: dict[str, str], timeout_s: float) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` for the SDK's transport whose connections are ``GuardedBackend``'s: no redirects
    of its own, no proxies or certificates from the environment; ``timeout_s`` seconds per HTTP phase."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore2.AsyncConnectionPool(ssl_context=httpx2.create_ssl_context(trust_env=False),
                                                    network_backend=GuardedBackend(), **POOL)
    return httpx2.AsyncClient(transport=transport, trust_env=False, follow_redirects=False, headers=headers,
                              timeout=httpx2.Timeout(timeout_s))


@asynccontextmanager
async def connected(profile: ServerProfile, *, timeout_s: float) -> AsyncIterator[Client]:
    """An SDK ``Client`` connected to ``profile``'s server (protocol negotiated), closed on exit.

    ``timeout_s``: seconds each HTTP phase and each request may take.
    Raises ``ToolNotSent`` when it cannot connect or open the session
    (nothing of the body was sent), ``ToolUnavailable`` when the connection
    fails later, ``ToolError`` for a protocol error answer or an unset auth
    header variable (nothing sent); the last two also for what the body of
    the ``with`` raises of those kinds.
    """
    try:
        headers = profile.headers()
    except ImproperlyConfigured as exc:  # a definite failure: nothing was sent (as for HTTP tools)
        raise ToolError(f"{exc} Nothing was sent.") from None
    session_open = False
    try:
        async with guarded_http_client(headers, timeout_s) as http:
            async with Client(streamable_http_client(profile.url, http_client=http), cache=None,
                              read_timeout_seconds=timeout_s, client_info=CLIENT_INFO) as client:
                session_open = True
                yield client
    except (ToolError, ToolUnavailable):
        raise
    except BaseException as exc:  # the SDK's task groups wrap failures in (nested) exception groups
        failure = _failure(exc, profile, session_open=session_open)
        if failure is None:
            raise
        if not session_open and type(failure) is ToolUnavailable:  # the call itself was never sent
            failure = ToolNotSent(f"{failure} Nothing was sent.")
        raise failure from None


def _failure(exc: BaseException, profile: ServerProfile, *, session_open: bool) -> ToolError | None:
    """What ``exc`` (raised talking to ``profile``'s server, its session open or not yet) means for a call, or
    None: not ours to translate."""
    if isinstance(exc, BaseExceptionGroup):
        found = [_failure(inner, profile, session_open=session_open) for inner in exc.exceptions]
        found = [failure for failure in found if failure is not None]
        return found[0] if found else None
    if isinstance(exc, Unresolvable):  # DNS failed: no connection was made (ToolNotSent before the session)
        return ToolUnavailable(f"MCP server {profile.name} could not be reached (its name did not resolve).")
    if isinstance(exc, UnsafeURL):
        log.warning("MCP server %s: connection refused by the address guard: %s", profile.name, exc.message)
        if not session_open:
            return ToolError(f"MCP server {profile.name} is at an address this server may not call; "
                             "nothing was sent.")
        return ToolUnavailable(f"MCP server {profile.name}: a connection went to an address this server may "
                               "not call.")
    if isinstance(exc, MCPError):
        if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
            return ToolUnavailable(f"MCP server {profile.name}: {exc.error.message}.")
        return ToolError(f"MCP server {profile.name} answered with an error: {exc.error.message}")
    if isinstance(exc, (httpx2.TransportError, StreamableHTTPError, TimeoutError, OSError)):
        return ToolUnavailable(f"MCP server {profile.name} could not be reached ({type(exc).__name__}).")
    if isinstance(exc, httpx2.HTTPStatusError):
        return ToolUnavailable(f"MCP server {profile.name} answered HTTP {exc.response.status_code}.")
    return None


async def list_tools(profile: ServerProfile) -> list[ListedTool]:
    """Every tool ``profile``'s server lists now (all pages). Raises as ``connected`` does."""
    async with connected(profile, timeout_s=profile.timeout_s) as client:
        tools, cursor = [], None
        for _ in range(MAX_LISTING_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise ToolError(f"MCP server {profile.name} lists more than {MAX_LISTING_PAGES} pages of tools.")


async def call_tool(profile: ServerProfile, name: str, arguments: dict, *, meta: dict,
                    timeout_s: float) -> CallToolResult:
    """Call the tool ``name`` on ``profile``'s server with ``arguments`` and request ``_meta`` ``meta``.

    Returns the server's ``CallToolResult`` (``is_error`` included: the
    caller decides). Raises as ``connected`` does.
    """
    async with connected(profile, timeout_s=timeout_s) as client:
        return await client.call_tool(name, arguments, meta=meta)
