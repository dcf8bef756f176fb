"""Tool names as model APIs accept them, and back.

OpenAI's Chat Completions and Anthropic's Messages APIs take tool names of
``[A-Za-z0-9_-]{1,64}`` only, while an MCP server's tools are named
``server.tool`` (``tools.mcp``) and a plug-in may pick any name. The engine
sends every other name in a form they take (``wire_names``): ``.`` becomes
``__`` and any other character ``_``; a name then too long, or taken by
another tool of the agent, is cut and given 8 hex digits of its sha256. The
same agent's tools always get the same forms, so the history sent again
(the assistant's earlier calls) keeps them, and the model's calls are read
back to the registered names (``real_names``) before anything is judged.
The history's calls count among those names: a tool no longer offered (an
earlier version's, one held for an operator) still appears there.
"""

import hashlib
import re

ACCEPTED = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CHARS = 64


def wire_names(names) -> dict[str, str]:
    """``{name: its form on the wire}`` for those of ``names`` (an iterable of ``str``) a model API refuses;
    a name it accepts is sent as it is and has no entry."""
    names = sorted(set(names))
    taken = {name for name in names if ACCEPTED.fullmatch(name)}
    forms = {}
    for name in names:
        if name in taken:
            continue
        form = re.sub(r"[^A-Za-z0-9_-]", "_", name.replace(".", "__")) or "tool"
        if len(form) > MAX_CHARS or form in taken:
            form = f"{form[:MAX_CHARS - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        taken.add(form)
        forms[name] = form
    return forms


def on_the_wire(tools: list[dict], messages: list[dict]) -> tuple[list[dict], list[dict], dict[str, str]]:
    """``(tools, messages, back)``: the request's tool definitions (``{"name", ...}``) and neutral messages
    (``{"role", "tool_calls"?: [{"name", ...}]}``) with the names a model API refuses replaced
    (``wire_names``; copies, the inputs are left alone), and ``{wire form: registered name}`` to read the
    model's calls back with (``real_names``). The history's calls are named the same way: they may be of tools
    not offered now (an earlier version's, an MCP tool held for an operator), and the APIs refuse a name there too."""
    called = [call["name"] for message in messages for call in message.get("tool_calls") or []
              if isinstance(call.get("name"), str)]
    forms = wire_names([tool["name"] for tool in tools] + called)
    if not forms:
        return tools, messages, {}
    tools = [{**tool, "name": forms.get(tool["name"], tool["name"])} for tool in tools]
    messages = [{**message, "tool_calls": [{**call, "name": forms.get(call.get("name"), call.get("name"))}
                                           for call in message["tool_calls"]]}
                if message.get("tool_calls") else message for message in messages]
    return tools, messages, {form: name for name, form in forms.items()}


def real_names(calls: list[dict], back: dict[str, str]) -> None:
    """Give each of the model's ``calls`` (``{"name", ...}``, changed in place) its registered name."""
    for call in calls or []:
        if isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"] in back:  # else as it came
            call["name"] = back[call["name"]]
