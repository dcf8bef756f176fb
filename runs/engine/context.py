"""Build what one model call sees: instructions, tools and a trimmed history.

The stored ``Message`` rows are only read, never changed (docs/design.md#context).

Trimming strategy, when the history does not fit:

1. Tokens are estimated as ``ceil(characters / 4) + 4`` per message
   (tool calls count their name and raw arguments); the window is the
   agent's ``model["context_window"]`` or ``TOLLGATE["CONTEXT_MAX_TOKENS"]``,
   minus the instructions, the tool definitions and the output reserve
   (``model["max_output_tokens"]`` or ``TOLLGATE["DEFAULT_MAX_OUTPUT_TOKENS"]``,
   at most a quarter of the window).
2. The history is cut into *units* that are kept or dropped whole: an
   assistant message with tool calls together with the tool results that
   answer it; every other message alone.
3. Kept: the unit holding the current run's first user message (the task)
   and the longest run of most recent units that fits in what is left. The
   newest unit is kept even if it alone is too big (the provider will then
   refuse, which is an honest model_error).
4. Each gap of dropped units becomes one ``system`` note: "N earlier
   messages were omitted".
5. Repair, in the context only: a tool call without a stored result gets
   one rendered from what is known of it now (``tools.services.
   tool_result_content``): "unknown, being checked" for a call whose
   outcome is open, the real result once reconciliation settled it -- never
   "did not run" for a call that was sent. A call with no record at all
   gets ``{"status": "missing"}``; a tool result without its call is
   dropped. So a provider never sees a dangling ``tool_call_id``.
"""

import json
import math
from dataclasses import dataclass

from django.conf import settings

from runs.models import Message, Run
from tools.models import ToolCall
from tools.registry import tools_for_agent
from tools.services import tool_result_content

PER_MESSAGE_TOKENS = 4
MISSING_RESULT = json.dumps({"status": "missing", "error": "No record of this call was kept."})


@dataclass
class Context:
    """``messages``: neutral dicts for ``ModelRequest.messages``; ``omitted``:
    stored messages left out; ``estimated_tokens``: of the whole request;
    ``last_message_id``: the newest stored message read (0: none)."""

    instructions: str
    tools: list[dict]
    messages: list[dict]
    omitted: int
    estimated_tokens: int
    last_message_id: int = 0


def estimate_tokens(message: dict) -> int:
    """Rough token count of one neutral message (characters / 4, plus overhead)."""
    chars = len(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        chars += len(call.get("name") or "") + len(call.get("arguments") or "")
    return math.ceil(chars / 4) + PER_MESSAGE_TOKENS


def as_model_message(message: Message) -> dict:
    """A stored message as a neutral dict ``{"role", "content", "tool_calls"?, "tool_call_id"?}``."""
    out = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [dict(call) for call in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def _units(messages: list[dict], known: dict[str, str]) -> list[list[dict]]:
    """Group messages into keep-or-drop-together units, repairing call/result pairs.

    ``known`` maps a call id without a stored result to the result text to show.
    """
    units: list[list[dict]] = []
    open_calls: dict[str, list[dict]] = {}  # call id -> the unit that made the call
    for message in messages:
        if message["role"] == "tool":
            unit = open_calls.pop(message.get("tool_call_id", ""), None)
            if unit is not None:  # a result without its call is dropped
                unit.append(message)
            continue
        unit = [message]
        units.append(unit)
        for call in message.get("tool_calls") or []:
            earlier = open_calls.pop(call["id"], None)
            if earlier is not None:  # an id reused before its result came: close the earlier call
                earlier.append(_missing(call["id"], known))
            open_calls[call["id"]] = unit
    for call_id, unit in open_calls.items():
        unit.append(_missing(call_id, known))
    return units


def _missing(call_id: str, known: dict[str, str]) -> dict:
    content = known.get(call_id, MISSING_RESULT)
    return {"role": "tool", "tool_call_id": call_id, "content": content, "synthetic": True}


def _note(count: int) -> dict:
    noun = "message was" if count == 1 else "messages were"
    return {"role": "system", "content": f"{count} earlier {noun} omitted to fit the context window."}


def trim_history(messages: list[dict], *, budget_tokens: int, pinned_index: int | None = None,
                 known_results: dict[str, str] | None = None) -> tuple[list[dict], int]:
    """Fit ``messages`` into ``budget_tokens`` (see the module docstring).

    ``pinned_index``: the position in ``messages`` of the message that must
    stay (the current run's task). ``known_results``: result text for calls
    whose result message is missing, by call id. Returns
    ``(messages, omitted_count)``; the input list and its dicts are not modified.
    """
    pinned = messages[pinned_index] if pinned_index is not None else None
    units = _units(messages, known_results or {})
    sizes = [sum(estimate_tokens(m) for m in unit) for unit in units]
    keep = [False] * len(units)
    # Room for the notes that stand in for dropped units: one before the
    # pinned task and one after it at most.
    remaining = budget_tokens - 2 * estimate_tokens(_note(10**9))
    for i, unit in enumerate(units):
        if any(m is pinned for m in unit):
            keep[i] = True
            remaining -= sizes[i]
    for i in range(len(units) - 1, -1, -1):
        if keep[i]:
            continue
        if sizes[i] > remaining and i != len(units) - 1:
            break
        keep[i] = True
        remaining -= sizes[i]
    out, gap, omitted = [], 0, 0
    for unit, kept in zip(units, keep):
        if not kept:
            gap += sum(1 for m in unit if not m.get("synthetic"))
            continue
        if gap:
            out.append(_note(gap))
            omitted += gap
            gap = 0
        out.extend({k: v for k, v in m.items() if k != "synthetic"} if m.get("synthetic") else m for m in unit)
    if gap:  # cannot happen: the newest unit is always kept
        out.append(_note(gap))
        omitted += gap
    return out, omitted


def window_tokens(model_config: dict) -> int:
    """The context window for an agent's model config (tokens)."""
    return int((model_config or {}).get("context_window") or settings.TOLLGATE["CONTEXT_MAX_TOKENS"])


def build_context(run: Run, history: list[Message]) -> Context:
    """The context for ``run``'s next model call; ``history``: the session's messages in id order
    (``runs.engine.state.Known.history``)."""
    agent = run.agent
    tools = [tool.definition() for tool in tools_for_agent(agent)]
    messages = [as_model_message(m) for m in history]
    pinned_index = next((i for i, m in enumerate(history) if m.run_id == run.pk and m.role == "user"), None)
    window = window_tokens(agent.model)
    reserve = min((agent.model or {}).get("max_output_tokens") or settings.TOLLGATE["DEFAULT_MAX_OUTPUT_TOKENS"],
                  window // 4)
    fixed = math.ceil((len(agent.instructions) + len(json.dumps(tools))) / 4)
    trimmed, omitted = trim_history(messages, budget_tokens=window - reserve - fixed, pinned_index=pinned_index,
                                    known_results=_results_without_message(run.session_id, history))
    estimated = fixed + sum(estimate_tokens(m) for m in trimmed)
    return Context(instructions=agent.instructions, tools=tools, messages=trimmed,
                   omitted=omitted, estimated_tokens=estimated, last_message_id=history[-1].pk if history else 0)


def _results_without_message(session_id: int, stored: list[Message]) -> dict[str, str]:
    """Result text, by call id, for the session's calls that have no stored result message (one query at most)."""
    answered = {m.tool_call_id for m in stored if m.role == "tool"}
    unanswered = {call["id"] for m in stored for call in (m.tool_calls or []) if call["id"] not in answered}
    if not unanswered:
        return {}
    calls = ToolCall.objects.filter(run__session_id=session_id, provider_call_id__in=unanswered)
    return {call.provider_call_id: tool_result_content(call) for call in calls}
