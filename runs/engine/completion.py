"""Completion checks: code, not the model, decides whether a run is done and what it achieved.

When the model gives a final answer, ``evaluate(run)`` returns a
``Verdict``. Two layers decide it:

1. **The floor** (``judge_calls``), a pure rule over the run's tool calls
   and their statuses. It is the whole of the ``default`` check and it
   binds every other check too.
2. **A domain check** named in ``Agent.completion_check`` (registered in
   code with ``register_check``, e.g. by the demo app: its ``refund`` in
   ``tools.demo.checks``), which knows what the task was.

The floor's rule, over the calls in the order they were proposed:

* a call still owing a result (proposed, awaiting approval, ready,
  running, unknown) -> **incomplete** (the model is told, within
  ``MAX_INCOMPLETE_NUDGES``);
* a call that ended without its effect -- ``invalid``, ``denied``,
  ``rejected``, ``expired``, ``cancelled`` or ``failed`` (which includes an
  unknown outcome settled as "did not happen") -- is *unresolved* unless a
  later call of the same tool **on the same target** succeeded with an
  effect of its own (the model corrected itself). The target is the value
  of the tool's ``target_key`` argument (e.g. the refund's ``order_id``);
  for a tool without one, or an ``invalid`` call (its arguments cannot be
  trusted to name a target), any later success of the tool counts. A re-proposal answered with
  an earlier result (``duplicate_of``) is no new success and corrects
  nothing;
* a call of a tool the agent does not have is ignored (it names no effect,
  and the model was told so);
* the goal is the run's effects: an unresolved side effect -> **not_achieved**,
  with a reason naming the first unresolved call ("refund #14 rejected: A
  person rejected this call. Comment: ..."). An unresolved *read-only* call
  decides only when no side effect succeeded (a run of lookups, whose reads
  are its goal): then -> **not_achieved** too. When a side effect succeeded
  the failed reads are not held against it: -> **achieved**, the reason
  naming them ("done: book_room #7 succeeded; read-only call(s) without
  their result: find_room #5 failed: ...");
* otherwise -> **achieved**. A side effect answered with an earlier call's
  result (``duplicate_of``: the same action, done once) is named as reused,
  never as an effect of its own ("done: refund #3 succeeded; reused:
  refund #4 (result of #3)").

A domain check keeps priority, with one limit: it may not call a run
``achieved`` while the floor says ``not_achieved`` unless it says why, with
``achieved(reason, despite="...")``; without that the floor's verdict
stands. The model's final text never enters any of this.
"""

import json
from dataclasses import dataclass
from typing import Callable, Iterable

from runs.base import selects
from runs.models import Outcome
from tools.models import ToolCall, ToolCallStatus
from tools.models.tool_call import NO_EFFECT_STATUSES, PENDING_STATUSES
from tools.registry import tools_for_agent
from tools.services import canonical_value

S = ToolCallStatus
MAX_REASON_CHARS = 500


@dataclass(frozen=True)
class Verdict:
    """``complete`` with an ``outcome`` (achieved / not_achieved), or not; ``reason`` says why.

    ``despite``: only for an ``achieved`` verdict of a domain check, the
    check's explanation for overruling the floor's ``not_achieved``.
    """

    complete: bool
    outcome: str = ""
    reason: str = ""
    despite: str = ""


def achieved(reason: str = "", *, despite: str = "") -> Verdict:
    return Verdict(True, Outcome.ACHIEVED, reason, despite)


def not_achieved(reason: str = "") -> Verdict:
    return Verdict(True, Outcome.NOT_ACHIEVED, reason)


def incomplete(reason: str) -> Verdict:
    return Verdict(False, reason=reason)


@dataclass(frozen=True)
class CallFact:
    """What the floor knows of one tool call: ``id`` (proposal order), tool, side effect, status, error.

    ``registered``: whether ``tool`` is one the agent has (False for an invented or withheld name);
    ``target``: the canonical value of the tool's ``target_key`` argument ("" if none);
    ``original``: the id of the earlier call whose result answered it (``duplicate_of``), or None.
    """

    id: int
    tool: str
    side_effect: bool
    status: str
    error: str = ""
    registered: bool = True
    target: str = ""
    original: int | None = None

    @property
    def duplicate(self) -> bool:
        """Whether the call was answered with an earlier call's result (the same action, not a new one)."""
        return self.original is not None


def _describe(fact: CallFact) -> str:
    text = f"{fact.tool} #{fact.id} {fact.status}"
    return f"{text}: {fact.error}" if fact.error else text


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def judge_calls(facts: Iterable[CallFact]) -> Verdict:
    """The floor: the verdict that a run's tool calls alone support (see the module doc).

    ``facts`` may come in any order; they are judged in ``id`` order.
    Pure: no database, no clock.
    """
    facts = sorted((fact for fact in facts if fact.registered), key=lambda fact: fact.id)
    pending = [fact for fact in facts if fact.status in PENDING_STATUSES]
    if pending:
        listed = ", ".join(f"{fact.tool} #{fact.id} ({fact.status})" for fact in pending)
        return incomplete(_clip(f"{len(pending)} tool call(s) have not finished: {listed}."))
    unresolved = unresolved_calls(facts)
    deciding = deciding_calls(facts, unresolved)
    if deciding:
        first = next(fact for fact in unresolved if fact in deciding)
        others = f" (and {len(unresolved) - 1} more)" if len(unresolved) > 1 else ""
        return not_achieved(_clip(_describe(first) + others))
    succeeded = [fact for fact in facts if fact.status == S.SUCCEEDED]
    if not succeeded:
        return achieved("answered without tool calls")
    effects = [fact for fact in succeeded if fact.side_effect]
    if not effects:
        return achieved(f"{len(succeeded)} read-only tool call(s) succeeded")
    done = [f"{fact.tool} #{fact.id} succeeded" for fact in effects if not fact.duplicate]
    reused = [f"{fact.tool} #{fact.id} (result of #{fact.original})" for fact in effects if fact.duplicate]
    parts = ["done: " + ", ".join(done)] if done else []
    if reused:
        parts.append("reused: " + ", ".join(reused))
    if unresolved:
        parts.append("read-only call(s) without their result: " + ", ".join(map(_describe, unresolved)))
    return achieved(_clip("; ".join(parts)))


def deciding_calls(facts: list[CallFact], unresolved: list[CallFact]) -> list[CallFact]:
    """Those of ``unresolved`` (``unresolved_calls(facts)``) that make the run ``not_achieved``.

    Every unresolved side effect; the unresolved read-only calls only when
    no side effect of ``facts`` succeeded (see the module doc). Pure.
    """
    if any(fact.side_effect and fact.status == S.SUCCEEDED for fact in facts if fact.registered):
        return [fact for fact in unresolved if fact.side_effect]
    return list(unresolved)


def unresolved_calls(facts: Iterable[CallFact]) -> list[CallFact]:
    """The calls that ended without their effect and that no later call made up for, in ``id`` order; pure.

    Of the agent's tools' calls, those in ``NO_EFFECT_STATUSES`` not corrected by a later success of the same tool on the
    same target (the floor's rule: the module doc).
    """
    facts = sorted((fact for fact in facts if fact.registered), key=lambda fact: fact.id)
    return [fact for index, fact in enumerate(facts)
            if fact.status in NO_EFFECT_STATUSES and not _corrected(fact, facts[index + 1:])]


def _corrected(failed: CallFact, later: list[CallFact]) -> bool:
    """Whether a later call of the same tool made up for ``failed`` (see the module doc)."""
    return any(
        call.tool == failed.tool and call.status == S.SUCCEEDED and not call.duplicate
        and (not failed.target or failed.status == S.INVALID or call.target == failed.target)
        for call in later
    )


def call_facts(run, calls: Iterable[ToolCall] | None = None) -> list[CallFact]:
    """The ``CallFact`` of every tool call of ``run``: one query, or none when ``calls`` (its ``ToolCall`` rows) are given."""
    offered = {tool.name: tool for tool in tools_for_agent(run.agent)}
    if calls is None:
        rows = selects.values(ToolCall, {"run": run.pk}, (
            "id", "name", "side_effect", "status", "error", "arguments", "duplicate_of"), order_by="id")
    else:
        rows = [(call.pk, call.name, call.side_effect, call.status, call.error, call.arguments, call.duplicate_of_id)
                for call in calls]
    return [CallFact(pk, name, side_effect, status, error, registered=name in offered,
                     target=_target(offered.get(name), arguments), original=original)
            for pk, name, side_effect, status, error, arguments, original in rows]


def _target(tool, arguments) -> str:
    key = getattr(tool, "target_key", "") or ""
    if not key or not isinstance(arguments, dict) or key not in arguments:
        return ""
    return json.dumps(canonical_value(arguments[key]), sort_keys=True, default=str)


_CHECKS: dict[str, Callable] = {}


def register_check(name: str):
    """Decorator: register ``fn(run) -> Verdict`` as completion check ``name``."""

    def decorate(fn):
        _CHECKS[name] = fn
        return fn

    return decorate


def check_names() -> list[str]:
    """Names of every registered check, sorted."""
    return sorted(_CHECKS)


def evaluate(run) -> Verdict:
    """Judge ``run``: the floor, then the agent's domain check within it (see the module doc).

    Raises ``KeyError`` for an unknown check (agents are validated at
    creation, so only a check removed from the code since).
    """
    name = run.agent.completion_check
    check = _CHECKS[name]
    floor = judge_calls(call_facts(run))
    if not floor.complete or name == "default":
        return floor
    verdict = check(run)
    if verdict.complete and verdict.outcome == Outcome.ACHIEVED and floor.outcome == Outcome.NOT_ACHIEVED:
        if not verdict.despite:
            return floor
        reason = f"{verdict.reason or f'check {name} passed'}, despite {floor.reason} ({verdict.despite})"
        return achieved(_clip(reason))
    if verdict.reason:
        return verdict
    # A check that says only "achieved" / "not achieved": borrow the floor's account when it agrees.
    reason = floor.reason if verdict.outcome == floor.outcome else f"check {name}: {verdict.outcome}"
    return Verdict(verdict.complete, verdict.outcome, reason)


@register_check("default")
def default_check(run) -> Verdict:
    """The ``default`` check: the floor alone."""
    return judge_calls(call_facts(run))
