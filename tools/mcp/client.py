"""One connection to an MCP server with the official SDK (Streamable HTTP), its failures as registry errors.

Each listing or call opens its own connection (``connected``): a worker
holds nothing open between calls, and a server restarted meanwhile is
simply connected to again. Failures are sorted the engine's way:

* the server could not be reached before the call was sent:
  ``ToolNotSent`` (the engine sends any call again after a backoff);
* the connection broke, or no answer came in time: ``ToolUnavailable``
  (the engine retries a read-only or idempotent call with backoff; a
  side-effecting one becomes ``unknown``);
* the server answered with a protocol error (unknown tool, bad
  arguments...): ``ToolError``, a failed call the model is told about.
"""

from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import StreamableHTTPError, streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CallToolResult, Implementation, Tool as ListedTool
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from django.core.exceptions import ImproperlyConfigured

from tools.mcp.conf import ServerProfile
from tools.registry import ToolError, ToolNotSent, ToolUnavailable

CLIENT_INFO = Implementation(name="tollgate", version="1")
MAX_LISTING_PAGES = 20


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
        async with create_mcp_http_client(headers=headers, timeout=httpx2.Timeout(timeout_s)) as http:
            async with Client(streamable_http_client(profile.url, http_client=http), cache=None,
                              read_timeout_seconds=timeout_s, client_info=CLIENT_INFO) as client:
                session_open = True
                yield client
    except (ToolError, ToolUnavailable):
        raise
    except BaseException as exc:  # the SDK's task groups wrap failures in (nested) exception groups
        failure = _failure(exc, profile)
        if failure is None:
            raise
        if not session_open and type(failure) is ToolUnavailable:  # the call itself was never sent
            failure = ToolNotSent(f"{failure} Nothing was sent.")
        raise failure from None


def _failure(exc: BaseException, profile: ServerProfile) -> ToolError | None:
    """What ``exc`` (raised talking to ``profile``'s server) means for a call, or None: not ours to translate."""
    if isinstance(exc, BaseExceptionGroup):
        found = [_failure(inner, profile) for inner in exc.exceptions]
        found = [failure for failure in found if failure is not None]
        return found[0] if found else None
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
