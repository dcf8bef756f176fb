"""A real MCP server for the tests, built with the SDK's server side (``MCPServer``), over Streamable HTTP.

``python tests/support/fakes/mcp_server.py PORT JOURNAL [--changed] [--read-only]`` serves on
``http://127.0.0.1:PORT/mcp``:

* ``lookup(key)``: read-only (``readOnlyHint``), answers ``{"key", "value"}``;
* ``delete_record(record_id, reason)``: destructive (no ``destructiveHint: false``);
  ``record_id`` is an integer from 1 to 100 in its ``inputSchema``;
* ``tag_record(record_id, tag)``: ``idempotentHint`` and not destructive, with
  structured content: tags once per ``io.tollgate/idempotencyKey`` in the
  request's ``_meta`` (``keys_seen`` counts the keys);
* ``failing()``: read-only, always an ``isError`` result;
* ``picture()``: read-only, a text block and a small PNG image block.

Each call appends a JSON line to JOURNAL (``{"tool", "arguments", "meta"}``)
before acting; a call whose arguments carry ``hold_s`` > 0 then sleeps that
long, so a test can cut its connection meanwhile. ``--changed`` serves
``delete_record`` with another schema (``record_id`` up to 1000): a listing
that changed; ``--read-only`` serves ``delete_record`` marked ``readOnlyHint: true``
(a change that claims it is safe). Requests must carry ``Authorization: Bearer s3cret`` (else 401).
"""

import asyncio
import base64
import json
import sys
from typing import Annotated

import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

PORT, JOURNAL = int(sys.argv[1]), sys.argv[2]
CHANGED = "--changed" in sys.argv[3:]
READ_ONLY = "--read-only" in sys.argv[3:]
TOKEN = "Bearer s3cret"
PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a") + b"\0" * 24).decode()

server = MCPServer("tollgate-test")
keys_seen: set[str] = set()


def journal(tool: str, arguments: dict, ctx: Context) -> None:
    with open(JOURNAL, "a") as out:
        out.write(json.dumps({"tool": tool, "arguments": arguments, "meta": dict(ctx.request_context.meta or {})})
                  + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(key: str, ctx: Context) -> dict:
    """Look a record up by its key."""
    journal("lookup", {"key": key}, ctx)
    return {"key": key, "value": f"value of {key}"}


@server.tool(annotations=ToolAnnotations(read_only_hint=READ_ONLY))
async def delete_record(record_id: Annotated[int, Field(ge=1, le=1000 if CHANGED else 100)], reason: str,
                        ctx: Context, hold_s: float = 0) -> dict:
    """Delete a record for good."""
    journal("delete_record", {"record_id": record_id, "reason": reason}, ctx)
    await asyncio.sleep(hold_s)
    return {"deleted": record_id}


class Tagged(BaseModel):
    record_id: int
    tag: str
    keys_seen: int


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
async def tag_record(record_id: int, tag: str, ctx: Context, hold_s: float = 0) -> Tagged:
    """Put a tag on a record (once per idempotency key); ``keys_seen``: distinct keys tagged under so far."""
    journal("tag_record", {"record_id": record_id, "tag": tag}, ctx)
    await asyncio.sleep(hold_s)
    key = (ctx.request_context.meta or {}).get("io.tollgate/idempotencyKey", "")
    keys_seen.add(key)
    return Tagged(record_id=record_id, tag=tag, keys_seen=len(keys_seen))


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def failing(ctx: Context) -> dict:
    """Always fails."""
    journal("failing", {}, ctx)
    raise ToolError("the record store is read-only today")


@server.tool(annotations=ToolAnnotations(read_only_hint=True), structured_output=False)
def picture(ctx: Context) -> list:
    """A picture of the record."""
    journal("picture", {}, ctx)
    return [TextContent(type="text", text="here it is"), ImageContent(type="image", data=PNG, mimeType="image/png")]


class NeedsToken(BaseHTTPMiddleware):
    async def dispatch(self, request, call_next):
        if request.headers.get("authorization") != TOKEN:
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return await call_next(request)


app = server.streamable_http_app()
app.add_middleware(NeedsToken)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
