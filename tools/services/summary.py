"""How pending tool calls read to a person: a one-line summary, risk fields, target, related calls.

A tool may declare ``Tool.summarize`` (a batch hook: one ``Description``
per arguments dict) and ``Tool.judge_together`` (whether several pending
calls on one target can all succeed); see ``tools.registry``. Without a
hook the fallback reads "tool_name(key=value, ...)" from the top-level
arguments. Everything here is batched: ``describe_many`` calls each tool's
hook once for all its calls, so a page of N rows costs a fixed number of
queries per tool, not one per row. ``title_of`` is the call in a few words
(``Tool.title``, which never queries), for an inbox item's title.

``target_of`` is the grouping key of "other pending calls on the same
target": the tool's name and the canonical value of its ``target_key``
argument, stored on the inbox item when it is opened.
"""

import hashlib
import json
from collections import defaultdict

from runs.base.masking import mask_credentials
from tools.registry import Description, Together, get_tool
from tools.services.arguments import canonical_value

__all__ = ["Description", "Together", "describe", "describe_many", "judge_groups", "target_of", "title_of"]

FALLBACK_FIELDS = 4  # top-level arguments shown by the fallback
VALUE_CHARS = 60  # longest value the fallback shows, in characters
TARGET_CHARS = 200  # Interrupt.target's length


def _short(value) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = canonical_value(value)  # 12.0 reads 12
    text = value if isinstance(value, str) else json.dumps(canonical_value(value), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def _fallback(name: str, arguments, tool) -> Description:
    """The summary of a call whose tool has no ``summarize`` hook (or is unknown): name and top-level arguments."""
    if not isinstance(arguments, dict):
        return Description(text=name, risk_fields=())
    shown = mask_credentials(arguments)  # a fallback line may reach an email or a list: no secrets in it
    fields = tuple((str(key), _short(shown[key])) for key in _in_schema_order(shown, tool)[:FALLBACK_FIELDS])
    text = f"{name}(" + ", ".join(f"{key}={value}" for key, value in fields) + ")"
    target = ""
    if tool is not None and tool.target_key and tool.target_key in arguments:
        target = f"{tool.target_key} {_short(arguments[tool.target_key])}"
    return Description(text=text, risk_fields=fields, target=target)


def _in_schema_order(arguments: dict, tool) -> list:
    """The keys of ``arguments`` in the order of the tool's schema ``properties``, the rest by name.

    Not the stored order: a JSON column may not keep it (PostgreSQL's
    ``jsonb`` does not), and the same call must read the same everywhere.
    """
    declared = list((tool.parameters.get("properties") or {}) if tool is not None else {})
    return sorted(arguments, key=lambda key: (declared.index(key) if key in declared else len(declared), str(key)))


def describe_many(tool_calls) -> list[Description]:
    """One ``Description`` per call of ``tool_calls`` (objects with ``name`` and ``arguments``), in order.

    Calls are grouped by tool and each tool's ``summarize`` hook is called
    once with the arguments of all its calls. A hook that returns the wrong
    number of descriptions is a programming error (``AssertionError``).
    Calls with no arguments (invalid) and tools without a hook get the
    fallback. None in ``tool_calls`` gives an empty description.
    """
    described: list[Description | None] = [None] * len(tool_calls)
    by_tool: dict[str, list[int]] = defaultdict(list)
    for index, call in enumerate(tool_calls):
        if call is None:
            described[index] = Description(text="")
            continue
        tool = get_tool(call.name)
        if tool is not None and tool.summarize is not None and isinstance(call.arguments, dict):
            by_tool[call.name].append(index)
        else:
            described[index] = _fallback(call.name, call.arguments, tool)
    for name, indexes in by_tool.items():
        results = get_tool(name).summarize([tool_calls[i].arguments for i in indexes])
        assert len(results) == len(indexes), f"{name}.summarize returned {len(results)} for {len(indexes)} calls"
        for index, description in zip(indexes, results):
            described[index] = description
    return described


def describe(tool_call) -> Description:
    """The ``Description`` of one call (see ``describe_many``; prefer that for lists)."""
    return describe_many([tool_call])[0]


def title_of(tool_call) -> str:
    """``tool_call`` (with ``name`` and ``arguments``) in a few words, in the active language; no query.

    The tool's ``title`` hook, else (unknown tool, non-object arguments) the fallback ``tool(key=value, ...)``, masked.
    """
    tool = get_tool(tool_call.name)
    if tool is not None and tool.title is not None and isinstance(tool_call.arguments, dict):
        return tool.title(tool_call.arguments)
    return _fallback(tool_call.name, tool_call.arguments, tool).text


def judge_groups(name: str, groups: list[list[dict]]) -> list[Together]:
    """The verdict of tool ``name`` on each group of pending calls' arguments (one group: one target).

    The tool's ``judge_together`` hook is called once for all groups;
    without one (or for an unknown tool) each verdict is "cannot tell"
    (``all_can_succeed=None``).
    """
    tool = get_tool(name)
    if tool is None or tool.judge_together is None or not groups:
        return [Together(all_can_succeed=None) for _group in groups]
    verdicts = tool.judge_together(groups)
    assert len(verdicts) == len(groups), f"{name}.judge_together returned {len(verdicts)} for {len(groups)} groups"
    return verdicts


def target_of(tool, arguments) -> str:
    """The grouping key of the thing a call of ``tool`` acts on: ``"<tool>:<canonical target JSON>"``, or "".

    Empty when the tool names no ``target_key`` or the arguments lack a
    scalar value for it. Keys longer than 200 characters become their
    sha256 (still equal for equal targets).
    """
    if tool is None or not tool.target_key or not isinstance(arguments, dict):
        return ""
    value = arguments.get(tool.target_key)
    if value is None or isinstance(value, (dict, list)):
        return ""
    key = f"{tool.name}:" + json.dumps(canonical_value(value), ensure_ascii=False)
    return key if len(key) <= TARGET_CHARS else hashlib.sha256(key.encode()).hexdigest()

