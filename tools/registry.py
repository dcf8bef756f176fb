"""The tool registry: what a model may call, with schema and policy.

A tool is declared once, in code, with a JSON Schema for its arguments,
whether it has side effects, when it needs a human's approval and what
must hold before it may run. Agents choose tools by name
(docs/design.md#declaring-a-tool).
"""

import threading
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.validators import validate_email
from jsonschema import Draft202012Validator, FormatChecker

from tools.policy import check_rule

# Formats every tool schema enforces, on top of jsonschema's own:
# ``email`` is Django's validator (one address, no CR/LF), and
# ``header-text`` is a single line fit for a mail or HTTP header.
FORMAT_CHECKER = FormatChecker()


@FORMAT_CHECKER.checks("email", raises=ValidationError)
def _is_email(value) -> bool:
    if isinstance(value, str):
        validate_email(value)
    return True


@FORMAT_CHECKER.checks("header-text")
def _is_header_text(value) -> bool:
    """One line of text: no control character (``\\r``, ``\\n``, ``\\v``, ``\\f``, ``\\x1c``, NUL, ...),
    no Unicode line or paragraph separator (``str.splitlines`` breaks at all of these, and so may a mail
    library folding a header), no lone surrogate."""
    return not isinstance(value, str) or not any(
        unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp") for char in value)


class ToolError(Exception):
    """Raised by a tool handler when the action failed; the message goes to the model."""


class ToolTimeout(ToolError):
    """The call did not answer within the tool's ``timeout_s``: whether it took effect is unknown."""


class ToolUnavailable(ToolError):
    """A transient failure (connection refused, 5xx): retryable for read-only tools.

    For a side-effecting tool it is treated like a timeout: the effect may
    or may not have happened, so the call becomes ``unknown``.
    """


class ToolNotSent(ToolUnavailable):
    """A transient failure before anything was sent (no connection could be made): any call may be sent
    again, a side effect too, after its backoff and within ``max_attempts``; when they run out with none
    of them sent, the call fails (never ``unknown``: nothing can have happened).

    Raise it only when the request certainly never left (a refused or
    timed-out connect); once it may have, raise ``ToolUnavailable``.
    """


@dataclass(frozen=True)
class Reconciliation:
    """What a tool's ``reconcile(idempotency_key)`` hook learned from the external system.

    ``status``: ``succeeded`` (with ``result``), ``failed`` (with
    ``error``), or ``not_found`` (no trace of it yet: ask again later).
    """

    status: str
    result: Any = None
    error: str = ""


@dataclass(frozen=True)
class ToolContext:
    """What a handler or precondition may know: the run, its requester, the key (docs/design.md#declaring-a-tool).

    ``idempotency_key``: empty for preconditions; a read-only, non-``idempotent`` tool's names the action only.
    ``tool_call``: None while a call is assessed. ``timeout_s``: seconds. ``cancelled``: set when the engine stops
    waiting (a sync handler may stop early; an ``async def`` handler is cancelled).
    """

    run: Any
    user: Any
    idempotency_key: str = ""
    timeout_s: float = 30.0
    tool_call: Any = None
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class WaitSpec:
    """What a waiting tool's call makes its run wait for (``Tool.wait``; docs/design.md#waits).

    ``kind``: a registered kind (``tools.waits.register_wait_kind``); ``deadline``: an aware datetime (``scheduled``: the time,
    else the timeout); ``event_type`` / ``correlation_key``: ``external_event``'s; ``title``: an ``input`` item's question.
    """

    kind: str
    deadline: datetime
    event_type: str = ""
    correlation_key: str = ""
    title: str = ""


@dataclass(frozen=True)
class Description:
    """How one pending call reads to a person (``Tool.summarize``; ``tools.services.summary``).

    ``text``: one line; ``risk_fields``: ``((label, value), ...)`` of str, in reading order; ``target``: what it acts on ("order 123"), or empty.
    """

    text: str
    risk_fields: tuple[tuple[str, str], ...] = ()
    target: str = ""


@dataclass(frozen=True)
class Together:
    """A tool's verdict on several pending calls on one target (``Tool.judge_together``).

    ``all_can_succeed``: True / False, or None when the tool cannot tell;
    ``note``: one line saying why ("3 refunds ask 210.00; 95.00 refundable").
    """

    all_can_succeed: bool | None
    note: str = ""


@dataclass(frozen=True)
class Tool:
    """One registered tool (what each field means for the engine: docs/design.md#declaring-a-tool).

    * ``parameters``: JSON Schema (draft 2020-12) of the arguments object.
    * ``handler(ctx, arguments) -> JSON-serialisable result``, a plain function (run in
      the ``TOOL_THREADS`` pool) or an ``async def`` (awaited on the engine's loop);
      raises ``ToolError`` (or ``ToolTimeout``, ``ToolUnavailable``, ``ToolNotSent``).
    * ``side_effect``: running it changes the world (idempotency key, no blind retry).
    * ``approval``: ``"never"``, ``"always"`` or a rule such as ``"amount > 50"`` or
      ``"sum(amount) per target within 30d > 50"`` (``tools.policy``).
    * ``target_key``: the argument naming what the call acts on (e.g. ``order_id``).
    * ``precondition(ctx, arguments) -> str | None`` (may be ``async def``): a reason to deny
      the call, or None; one that raises or outlasts ``timeout_s`` denies it, after
      ``max_attempts`` tries if it outlasted it or raised ``ToolTimeout`` or ``ToolUnavailable``.
    * ``permission``: the Django permission an approver needs.
    * ``allow_requester_approval``: may the requester decide its items; None: only for
      read-only tools.
    * ``timeout_s``: seconds a call may take (``ToolContext.timeout_s``); then ``ToolTimeout``.
    * ``same_action``: ``"session"`` (default), ``"run"`` or a business key
      ``(ctx, arguments) -> str`` (``tools.services.arguments.action_identity``);
      ``ImproperlyConfigured`` for anything but the default on a read-only tool.
    * ``idempotent``: the external system deduplicates by our idempotency key.
    * ``reconcile(idempotency_key) -> Reconciliation`` (may be ``async def``): what became
      of a call whose outcome is unknown.
    * ``max_attempts`` / ``backoff_s`` (seconds): retry policy for read-only tools (and for a
      precondition's transient failures).
    * ``wait(ctx, arguments) -> WaitSpec``: makes the tool a waiting tool
      (``tools.builtin``): before its handler runs, the run waits for what
      the spec names, holding no worker; once that came (or timed out) the
      handler is called with ``ctx.tool_call.wait`` settled.
    * ``summarize(arguments_list) -> [Description]``: one per arguments dict, in order,
      for all the calls of a page at once; None: tool name and top-level arguments.
    * ``title(arguments) -> str``: the call in a few words, in the active language,
      without a query (``tools.services.summary.title_of``); None: as above.
    * ``judge_together(groups) -> [Together]``: for each group (the arguments of pending
      calls on one target), whether they can all succeed; once per page.
    * ``location``: where a tool run outside Tollgate lives, for people (``"HTTP bookings
      /tools/book"``, ``"MCP server files"``); empty for an in-process tool.
    """

    name: str
    description: str
    parameters: dict
    handler: Callable[[ToolContext, dict], Any]
    side_effect: bool = False
    approval: str = "never"
    precondition: Callable[[ToolContext, dict], str | None] | None = None
    permission: str = "approvals.decide_interrupt"
    allow_requester_approval: bool | None = None
    target_key: str = ""
    timeout_s: float = 30.0
    same_action: str | Callable[[ToolContext, dict], str] = "session"
    idempotent: bool = False
    reconcile: Callable[[str], Reconciliation] | None = None
    max_attempts: int = 3
    backoff_s: float = 0.5
    wait: Callable[[ToolContext, dict], WaitSpec] | None = None
    summarize: Callable[[list[dict]], list[Description]] | None = None
    title: Callable[[dict], str] | None = None
    judge_together: Callable[[list[list[dict]]], list[Together]] | None = None
    location: str = ""
    validator: Draft202012Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        Draft202012Validator.check_schema(self.parameters)
        check_rule(self.approval, target_key=self.target_key)
        if not (self.same_action in ("session", "run") or callable(self.same_action)):
            raise ImproperlyConfigured(f"tool {self.name}: same_action is 'session', 'run' or a function, "
                             f"not {self.same_action!r}")
        if self.same_action != "session" and not self.side_effect:
            raise ImproperlyConfigured(f"tool {self.name}: only side-effecting calls are deduplicated; "
                             "same_action needs side_effect=True")
        object.__setattr__(self, "validator", Draft202012Validator(self.parameters, format_checker=FORMAT_CHECKER))

    @property
    def requester_may_decide(self) -> bool:
        """Whether the run's requester may decide this tool's items (see ``allow_requester_approval``)."""
        if self.allow_requester_approval is None:
            return not self.side_effect
        return self.allow_requester_approval

    def schema_errors(self, arguments: Any) -> list[str]:
        """Messages for every way ``arguments`` breaks the schema (empty: valid)."""
        return [
            f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in sorted(self.validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        ]

    def definition(self) -> dict:
        """The provider-neutral definition sent to a model: name, description, parameters."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


class ToolSource:
    """Tools declared outside code (e.g. the tools of MCP servers: ``tools.mcp.source``), looked up by name.

    The registry asks its sources only for names no registered tool has, so
    in-process tools cost them nothing.
    """

    def get(self, name: str) -> "Tool | None":
        """The tool called ``name`` if this source has it and it may be offered and called now, else None."""
        raise NotImplementedError

    def named(self, entry: str) -> "list[Tool] | None":
        """The tools an agent's ``tools`` entry stands for (e.g. ``server.*``: all of that server's);
        None when the entry is not this source's at all."""
        raise NotImplementedError

    def all(self) -> "list[Tool]":
        """Every tool of this source that may be offered now, sorted by name."""
        raise NotImplementedError

    def held(self, entry: str) -> bool:
        """Whether an agent's ``tools`` entry names tools of this source that exist but are all held for an
        operator now (e.g. an MCP tool whose definition changed), so ``named`` gives none of them."""
        return False


_TOOLS: dict[str, Tool] = {}
_SOURCES: list[ToolSource] = []


def register(tool: Tool) -> Tool:
    """Add ``tool`` to the registry. Raises ``ImproperlyConfigured`` if the name is taken by another tool."""
    if tool.name in _TOOLS and _TOOLS[tool.name] is not tool:
        raise ImproperlyConfigured(f"A tool named {tool.name!r} is already registered.")
    _TOOLS[tool.name] = tool
    return tool


def add_source(source: ToolSource) -> ToolSource:
    """Let ``source`` answer for the names no registered tool has (once per source object)."""
    if source not in _SOURCES:
        _SOURCES.append(source)
    return source


def get_tool(name: str) -> Tool | None:
    """The registered tool called ``name``, else the first source's tool of that name, or None."""
    tool = _TOOLS.get(name)
    if tool is None:
        tool = next((found for source in _SOURCES if (found := source.get(name)) is not None), None)
    return tool


def tools_named(entry: str) -> list[Tool]:
    """The tools an agent's ``tools`` entry stands for: the registered tool of that name, else what a source
    makes of it (``server.tool``, ``server.*``); empty for an entry that names nothing callable now."""
    if entry in _TOOLS:
        return [_TOOLS[entry]]
    for source in _SOURCES:
        found = source.named(entry)
        if found is not None:
            return found
    return []


def held_tool(entry: str) -> bool:
    """Whether an agent's ``tools`` entry (or a policy's tool name) names tools that exist but are held for an
    operator now (``ToolSource.held``): not callable, yet not unknown."""
    return entry not in _TOOLS and any(source.held(entry) for source in _SOURCES)


def all_tools() -> list[Tool]:
    """Every registered tool, sorted by name."""
    return [_TOOLS[name] for name in sorted(_TOOLS)]


def offered_tools() -> list[Tool]:
    """Every tool an agent may be given now: the registered ones, then each source's (``ToolSource.all``).

    Unlike ``all_tools`` it may query (a source's cache), so data
    migrations keep to ``all_tools``.
    """
    return all_tools() + [tool for source in _SOURCES for tool in source.all()]


def tools_for_agent(agent) -> list[Tool]:
    """The tools ``agent`` may call: those its ``tools`` list names (``tools_named``; an empty list: none),
    each once, in the list's order."""
    if all(name in _TOOLS for name in agent.tools):  # in-process tools only: no source is asked
        return [_TOOLS[name] for name in agent.tools]
    found = {tool.name: tool for entry in agent.tools for tool in tools_named(entry)}
    return list(found.values())
