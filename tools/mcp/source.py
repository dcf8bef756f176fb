"""The cached MCP tools as ``tools.registry.Tool``s (names ``server.tool``), and what their calls send and keep.

Annotations are hints from the server, so they can only make a tool
safer: a tool not marked ``readOnlyHint: true`` is a side effect; a side
effect whose ``destructiveHint`` is true or absent asks for approval
(``always``) unless the server profile's ``rules`` set the tool's rule;
``idempotentHint: true`` makes a side effect ``idempotent`` (a lost
connection or no answer in time sends it once more, under the same key).
Arguments are checked against ``inputSchema`` as any tool's are (an
approver's edit too).
"""

import base64
import binascii
import json
import logging
from dataclasses import dataclass

from django.conf import settings
from jsonschema import SchemaError

from tools.mcp.conf import ServerProfile, servers
from tools.models import McpTool
from tools.registry import Tool, ToolContext, ToolError, ToolSource

log = logging.getLogger(__name__)
META_PREFIX = "io.tollgate/"
# The handler stops waiting a little before the engine does, so a call with no answer in time is
# ToolUnavailable (sent again when idempotent) rather than the engine's ToolTimeout (always unknown).
ANSWER_SHARE_OF_TIMEOUT = 0.9
MAX_ERROR_CHARS = 2000


class McpSource(ToolSource):
    """The registry's source for ``server.tool`` and ``server.*`` (``tools.registry.ToolSource``).

    A name is this source's when its part before the first ``.`` is a
    configured server. A tool is there while it is listed and not held
    (``McpTool.held``). One query per lookup; the ``Tool`` built from a
    definition is kept while that definition and profile stay the same.
    """

    def __init__(self):
        self._built: dict[tuple, Tool | None] = {}

    def get(self, name: str) -> Tool | None:
        profile, tool_name = self._split(name)
        if profile is None or tool_name == "*":
            return None
        row = McpTool.objects.filter(server=profile.name, name=tool_name, listed=True).first()
        return self._tool(profile, row) if row is not None else None

    def named(self, entry: str) -> list[Tool] | None:
        profile, tool_name = self._split(entry)
        if profile is None:
            return None
        rows = McpTool.objects.filter(server=profile.name, listed=True)
        if tool_name != "*":
            rows = rows.filter(name=tool_name)
        return [tool for row in rows.order_by("name") if (tool := self._tool(profile, row)) is not None]

    def all(self) -> list[Tool]:
        return [tool for server in sorted(servers()) for tool in self.named(f"{server}.*")]

    def held(self, entry: str) -> bool:
        profile, tool_name = self._split(entry)
        if profile is None:
            return False
        rows = McpTool.objects.filter(server=profile.name, listed=True)
        rows = list(rows if tool_name == "*" else rows.filter(name=tool_name))
        return bool(rows) and all(row.held for row in rows)

    @staticmethod
    def _split(name: str) -> tuple[ServerProfile | None, str]:
        server, dot, tool_name = name.partition(".")
        profile = servers().get(server) if dot and tool_name else None
        return profile, tool_name

    def _tool(self, profile: ServerProfile, row: McpTool) -> Tool | None:
        if row.held:
            return None
        key = (row.server, row.name, row.fingerprint, row.approval_rule, repr(profile))
        if key not in self._built:
            self._built[key] = build_tool(profile, row)
        return self._built[key]


def default_rule(annotations: dict) -> str:
    """The approval rule a tool's ``annotations`` give, which can only make it safer: ``always`` unless it is
    marked ``readOnlyHint: true`` or ``destructiveHint: false``, else ``never``."""
    hints = annotations or {}
    return "always" if hints.get("readOnlyHint") is not True and hints.get("destructiveHint") is not False else "never"


@dataclass(frozen=True)
class Governance:
    """How a tool is governed (see the module doc): a ``side_effect``, ``idempotent``, asking for approval
    by the rule ``approval``."""

    side_effect: bool
    idempotent: bool
    approval: str


def governance(profile: ServerProfile | None, row: McpTool, annotations: dict) -> Governance:
    """How ``row``'s tool is governed with ``annotations`` (its listed or its accepted ones) under ``profile``
    (None: a server no longer configured): the operator's rule, else the profile's, else the annotations'."""
    hints = annotations or {}
    side_effect = hints.get("readOnlyHint") is not True
    approval = row.approval_rule or (profile.rules.get(row.name) if profile is not None else "") \
        or default_rule(hints)
    return Governance(side_effect=side_effect, idempotent=side_effect and hints.get("idempotentHint") is True,
                      approval=approval)


def build_tool(profile: ServerProfile, row: McpTool) -> Tool | None:
    """The registry ``Tool`` for the cached ``row`` of ``profile``'s server; None (logged) when its
    ``inputSchema`` is not a valid JSON Schema or its rule does not fit it."""
    governed = governance(profile, row, row.annotations)
    side_effect, approval, idempotent = governed.side_effect, governed.approval, governed.idempotent
    try:
        return Tool(name=row.full_name, description=row.description or row.full_name, parameters=row.input_schema,
                    handler=_handler(profile, row.name), side_effect=side_effect, approval=approval,
                    idempotent=idempotent, timeout_s=profile.timeout_s,
                    # "sent once more" for an idempotent side effect; reads as the profile says.
                    max_attempts=2 if idempotent else profile.max_attempts, backoff_s=profile.backoff_s,
                    location=f"MCP server {profile.name}")
    except (SchemaError, ValueError) as exc:
        log.warning("MCP tool %s cannot be offered: %s", row.full_name, exc)
        return None


def _handler(profile: ServerProfile, tool_name: str):
    async def call(ctx: ToolContext, arguments: dict):
        from tools.mcp import client  # the SDK is an optional extra: imported only once a server is used

        meta = {f"{META_PREFIX}idempotencyKey": ctx.idempotency_key, f"{META_PREFIX}runId": ctx.run.pk,
                f"{META_PREFIX}sessionId": ctx.run.session_id,
                f"{META_PREFIX}toolCallId": ctx.tool_call.pk if ctx.tool_call is not None else None}
        result = await client.call_tool(profile, tool_name, arguments, meta=meta,
                                        timeout_s=ctx.timeout_s * ANSWER_SHARE_OF_TIMEOUT)
        kept = kept_result(result.content, result.structured_content)
        if result.is_error:
            raise ToolError(kept.get("text", "")[:MAX_ERROR_CHARS] or f"{profile.name}.{tool_name} failed.")
        return kept

    call.__qualname__ = f"mcp:{profile.name}.{tool_name}"
    return call


def kept_result(content: list, structured) -> dict:
    """What is stored of a tool's answer: ``{"text"?, "structured"?, "content"?, "truncated"?}``.

    ``text``: the text blocks joined by newlines; ``structured``: the
    structured content as sent; ``content``: a typed reference for each
    other block, ``{"type", "mimeType", "size"}`` (bytes; ``uri`` too for a
    resource), never its data. Past ``TOLLGATE["MCP_MAX_RESULT_BYTES"]``
    (as JSON), the structured content is dropped and the text cut, with
    ``"truncated": true``.
    """
    texts, references = [], []
    for block in content:
        if block.type == "text":
            texts.append(block.text)
        else:
            references.append(_reference(block))
    kept = {}
    if texts:
        kept["text"] = "\n".join(texts)
    if structured is not None:
        kept["structured"] = structured
    if references:
        kept["content"] = references
    limit = settings.TOLLGATE["MCP_MAX_RESULT_BYTES"]
    if len(json.dumps(kept).encode()) > limit:
        kept.pop("structured", None)
        kept["text"] = kept.get("text", "").encode()[:limit // 2].decode(errors="ignore")
        kept["content"] = references[:32]
        kept["truncated"] = True
    return kept


def _reference(block) -> dict:
    """A non-text content block as ``{"type", "mimeType", "size"[, "uri"]}``."""
    resource = getattr(block, "resource", None)  # an embedded resource carries its data inside
    source = resource if resource is not None else block
    data = getattr(source, "blob", None) or getattr(source, "data", None)
    text = getattr(source, "text", None)
    if data:
        try:
            size = len(base64.b64decode(data, validate=False))
        except (binascii.Error, ValueError):
            size = len(data)
    else:
        size = len(text.encode()) if text else getattr(source, "size", None)
    reference = {"type": block.type, "mimeType": getattr(source, "mime_type", None), "size": size}
    uri = getattr(source, "uri", None)
    if uri is not None:
        reference["uri"] = str(uri)
    return reference


SOURCE = McpSource()
