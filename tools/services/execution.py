"""Executing a ready call: ``running`` and its idempotency key committed before the handler is
called, then its outcome; retries, and calls found in flight after a worker died.
"""

import asyncio
import inspect
import json
import logging
from typing import Callable

from django.conf import settings
from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone
from django_fsm import can_proceed

from config.strict_json import check_value
from runs.base.awaiting import Await, Interrupted, Steps, commit_point, full_jitter, run_blocking
from runs.base.failpoints import failpoint
from runs.models import Phase, Run, RunEvent
from runs.services import RunColumns, writes_held
from runs.transitions import apply
from tools.models import ToolCall, ToolCallStatus
from tools.registry import (
    Reconciliation, Tool, ToolContext, ToolError, ToolNotSent, ToolTimeout, ToolUnavailable, get_tool,
)
from tools.services.arguments import idempotency_key_base, same_action_scope
from tools.services.targets import Target, claim, claim_if_free, release, target_of

log = logging.getLogger(__name__)
S = ToolCallStatus
MAX_RESULT_DEPTH = 64  # nesting of a tool's result (objects and arrays) that is stored and shown


OutcomeHook = Callable[[ToolCall], list]
ColumnsHook = Callable[[], RunColumns | None]
BusyHook = Callable[[int, Target], None]


def execute_tool_call(tool_call: ToolCall, *, actor: str = "worker", on_target_busy: BusyHook,
                      with_outcome: OutcomeHook | None = None, run_columns: ColumnsHook | None = None,
                      assessed_now: bool = False, stop_at=None) -> Steps:
    """Run a ``ready`` call: commit ``running`` with its idempotency key, call, commit the outcome.

    A step (``runs.base.awaiting``): it yields the handler's call as an
    ``Await`` and returns the call. The handler is awaited when it is an
    ``async def``, else run in the sync handler pool; either way it ends
    at the tool's ``timeout_s`` (``ToolTimeout``): an async handler is
    cancelled, a sync one abandoned, and ``ToolContext.cancelled`` is set.
    The same happens past ``stop_at`` (the run's deadline, an aware
    datetime) or when the run's cancel is requested meanwhile
    (``runs.base.awaiting.Interrupted``): a side-effecting call is then
    ``unknown``, a read-only one ``failed``.

    The tool's precondition is checked again before the first attempt
    (``denied`` if it no longer holds, or cannot be checked:
    ``check_precondition``), as the world may have changed since
    the proposal or the approval; except for a read-only call the caller
    says was ``assessed_now`` (proposed ready moments ago by the same
    worker, nothing in between, no other call sent since:
    ``runs.engine.state.Known.assessed_here``). A side-effecting call is
    always checked again: an earlier call of the same turn may have changed
    what it relies on. A call whose attempts so far all certainly stayed
    here (``ToolNotSent``: ``ToolCall.maybe_sent`` is false) is checked as
    before its first. A side-effecting call sent before (its worker died,
    or it was ``unknown`` and is sent again) is first looked up by its key
    with the tool's ``reconcile`` hook: found, it is settled as found
    (``unknown``, then ``succeeded`` or ``failed``, nothing sent); not
    found, it is checked like a first send, except that a "no" from the
    precondition may be the call's own earlier send landing meanwhile: it
    is looked up once more, and settled as found or left ``unknown``
    (reconciliation), never ``denied``; the hook failing leaves it
    ``unknown`` (reconciliation). Without a hook it is sent again under
    its key, unchecked (its own earlier effect must not deny it).

    A side-effecting call on a target (``tools.services.targets``) claims
    it first; the claim lasts until the call's next outcome, so no other
    call of the tool on the target is checked or sent meanwhile. When
    another call holds the target, nothing is written except what
    ``on_target_busy(holder_id, target)`` writes, called in the
    transaction that found it so (the loop puts the run to wait there),
    and the call is returned still ``ready``.

    Outcomes: ``succeeded`` (result stored; a side-effecting call finding
    a call of the session that succeeded under its key reuses that result,
    nothing is executed again); ``failed``
    (``ToolError``; for read-only tools also after ``max_attempts``
    transient failures, and for any tool after ``max_attempts`` none of
    which left: ``ToolNotSent`` each); ``ready`` again (a transient failure
    with attempts left, of a read-only tool, ``ToolNotSent`` from any, or
    ``ToolUnavailable`` from an idempotent one: the caller waits
    ``retry_delay`` first; an attempt not sent is counted in
    ``unsent_attempts``); ``unknown``
    (any other side-effecting call that timed out, hit a transient error
    or raised something unexpected: never retried blindly).

    Two transactions at most (three with a claim): ``running`` with the key (and the run's
    phase ``executing_tools``) before the handler is called, and the
    outcome after it. In a group commit's job that logged events of the run
    before it (``runs.services.writes_held``: the model's answer proposing
    the call, another call's outcome), a claim comes after a commit point,
    so that it never takes down what came from outside.
    ``with_outcome(call)``, if given, is called inside the outcome's
    transaction, once the call's new state is set and before it is written:
    it returns new rows (of one model: the result messages,
    ``tools.services.results.tool_result_messages``) that the outcome's
    statement stores with it (``runs.transitions.apply``'s ``inserts``), so
    they commit with the outcome or not at all; it writes nothing itself.
    ``run_columns()``, if given, returns run columns (``RunColumns``) the
    outcome's statement writes too (as ``apply``'s ``columns``: put back on
    the run instance if the outcome is refused), or None.
    No transaction is open while the handler runs.
    """
    tool = get_tool(tool_call.name)

    def outcome(transition, **arguments) -> ToolCall:
        # A savepoint when nested (a group commit, runs.engine.group_commit): ``_store_result`` goes on
        # after a refused result, which only a savepoint leaves the enclosing transaction usable for.
        with transaction.atomic():
            apply(transition, actor=actor, savepoint=False, inserts=with_outcome,
                  columns=run_columns() if run_columns is not None else None, **arguments)
            if tool is not None:  # any outcome gives up the call's claim on its target
                release(tool_call, tool, actor=actor)
        return tool_call

    if tool is None:  # removed from the registry since it was proposed: it cannot be sent (again)
        error = f"The tool {tool_call.name!r} is no longer available."
        if tool_call.side_effect and can_proceed(tool_call.mark_unknown):  # sent: it may have taken effect
            return outcome(tool_call.mark_unknown, error=error)
        return outcome(tool_call.deny, reason="tool no longer registered", error=error)
    if tool.side_effect and tool.target_key and writes_held(tool_call.run):
        # A claim may wait for the target's row, or be failed by the deadlock detector: what this job stored
        # before it (the model's answer proposing this call, another call's outcome) is committed first.
        yield commit_point()
    target = target_of(tool, tool_call.arguments) if tool.side_effect else None
    if target is not None and not claim_if_free(target, tool_call):  # a free target: one statement, no transaction
        with transaction.atomic():
            holder = claim(target, tool_call)
            if holder is not None:
                on_target_busy(holder, target)
                return tool_call
    begun = yield from _begin(tool_call, tool, actor=actor, assessed_now=assessed_now, outcome=outcome,
                              stop_at=stop_at)
    if begun is None:  # settled without being sent
        return tool_call
    key, reusable = begun
    if reusable is not None:
        earlier_id, result = reusable
        return outcome(tool_call.succeed, reason=f"reused result of call {earlier_id}", result=result,
                       now=timezone.now(), reused_from=earlier_id)
    context = ToolContext(run=tool_call.run, user=tool_call.run.requested_by, idempotency_key=key,
                          timeout_s=tool.timeout_s, tool_call=tool_call)

    def start():  # once the key is committed
        failpoint("tool_call_started", tool_call.name, f"agent={tool_call.run.agent.slug}")
        return call_handler(tool, context, tool_call.arguments)

    try:
        result = yield Await(start=start,
                             timeout_s=tool.timeout_s, what=f"tool:{tool.name}", stop_at=stop_at,
                             timed_out=lambda: ToolTimeout(f"No answer within {tool.timeout_s:g} s."))
        failpoint("tool_call_returned", tool_call.name)
    except Interrupted as exc:
        error = f"Stopped waiting for the answer: {exc}."
        if tool.side_effect:
            return outcome(tool_call.mark_unknown, error=error)
        return outcome(tool_call.fail, error=error, now=timezone.now())
    except (ToolTimeout, ToolUnavailable) as exc:
        # Sending again is safe for read-only tools, for any call that was certainly not sent, and after
        # an explicit error answer for tools whose external system deduplicates by key.
        not_sent = isinstance(exc, ToolNotSent)
        may_retry = not tool.side_effect or not_sent or (tool.idempotent and isinstance(exc, ToolUnavailable))
        if may_retry and charged_attempts(tool_call) < tool.max_attempts:
            return outcome(tool_call.requeue, reason="retrying", error=str(exc), not_sent=not_sent)
        # No attempt left: a side effect of which some attempt may have gone out is unknown; one whose every
        # attempt certainly stayed here (this one and those before) did nothing: failed, like a read.
        if tool.side_effect and not (not_sent and tool_call.attempts == tool_call.unsent_attempts + 1):
            return outcome(tool_call.mark_unknown, error=f"{type(exc).__name__}: {exc}")
        return outcome(tool_call.fail, now=timezone.now(), error=f"Gave up after {tool_call.attempts} attempts: {exc}")
    except ToolError as exc:
        return outcome(tool_call.fail, error=str(exc), now=timezone.now())
    except Exception as exc:
        log.exception("tool %s raised", tool_call.name)  # the details stay in the log
        error = f"The tool failed unexpectedly ({type(exc).__name__})."
        if tool.side_effect:
            return outcome(tool_call.mark_unknown, error=error)
        return outcome(tool_call.fail, error=error, now=timezone.now())
    return _store_result(tool_call, tool, result, outcome)


def call_hook(tool: Tool, hook: Callable, *args, stop_at=None) -> Steps:
    """Call one of ``tool``'s hooks (``precondition``, ``reconcile``) as a step (``runs.base.awaiting``); returns its answer.

    Async hooks are awaited on the engine's loop, sync ones run in the handler pool. Raises what the hook raises,
    ``ToolTimeout`` past ``tool.timeout_s`` (seconds), ``Interrupted`` past ``stop_at`` (the run's deadline).
    """
    start = (lambda: hook(*args)) if inspect.iscoroutinefunction(hook) else (lambda: run_blocking(hook, *args))
    return (yield Await(start=start, timeout_s=tool.timeout_s, what=f"hook:{tool.name}",
                        timed_out=lambda: ToolTimeout(f"No answer within {tool.timeout_s:g} s."), stop_at=stop_at))


def check_precondition(tool: Tool, context: ToolContext, arguments: dict, *, stop_at=None,
                       tries: int | None = None) -> Steps:
    """Ask ``tool``'s precondition about ``arguments`` (``call_hook``); a step returning the reason to deny the call, or None.

    Fail-safe: a precondition that raises or times out denies it (naming the exception's type only). A transient
    failure (``ToolTimeout``, ``ToolUnavailable``: what it asks did not answer, or it outlasted ``tool.timeout_s``)
    is first tried again: up to ``tries`` tries in all (default ``tool.max_attempts``), after a full-jitter pause from
    ``tool.backoff_s`` seconds (``runs.base.awaiting.full_jitter``) awaited on the loop, each pause at most
    ``INLINE_BACKOFF_MAX_S`` (the call is in the middle of a step: at proposal its model step is started, before
    sending its target may be claimed, so it never waits longer the way a read's retry may). ``Interrupted``
    propagates (a cancel or the run's deadline during a try or a pause).
    """
    tries = max(1, tool.max_attempts if tries is None else tries)
    for attempt in range(1, tries + 1):
        try:
            return (yield from call_hook(tool, tool.precondition, context, arguments, stop_at=stop_at))
        except Interrupted:
            raise
        except (ToolTimeout, ToolUnavailable) as exc:
            if attempt == tries:
                log.warning("precondition of %s raised: %r (try %d of %d)", tool.name, exc, attempt, tries)
                return f"The precondition could not be checked ({type(exc).__name__})."
            log.info("precondition of %s raised: %r (try %d of %d); trying again", tool.name, exc, attempt, tries)
            delay = min(full_jitter(tool.backoff_s, attempt), settings.TOLLGATE["INLINE_BACKOFF_MAX_S"])
            yield Await(start=lambda: asyncio.sleep(delay), what="pause", stop_at=stop_at)
        except Exception as exc:
            log.warning("precondition of %s raised: %r", tool.name, exc)
            return f"The precondition could not be checked ({type(exc).__name__})."


async def call_handler(tool: Tool, context: ToolContext, arguments: dict):
    """Await ``tool``'s handler on ``arguments``: an ``async def`` handler on the event loop, a sync one in
    the sync handler pool (``runs.base.awaiting.run_blocking``). Cancelled (a timeout), it sets
    ``context.cancelled`` first, so a sync handler that looks can stop."""
    try:
        if inspect.iscoroutinefunction(tool.handler):
            return await tool.handler(context, arguments)
        return await run_blocking(tool.handler, context, arguments)
    except asyncio.CancelledError:
        context.cancelled.set()
        raise


def _begin(tool_call: ToolCall, tool: Tool, *, actor: str, assessed_now: bool, outcome, stop_at=None) -> Steps:
    """Commit ``running`` with the idempotency key; a step that returns ``(key, reusable)``
    (``_key_and_reusable_result``).

    Returns None instead when the checks before sending settled the call
    (``_instead_of_sending``: denied, or found by its key), each step
    stored by ``outcome(transition, **arguments)``.
    """
    instead = yield from _instead_of_sending(tool_call, tool, assessed_now=assessed_now, stop_at=stop_at)
    if instead:
        for name, arguments in instead:
            outcome(getattr(tool_call, name), **arguments)
        return None
    key, reusable = _key_and_reusable_result(tool_call, tool)
    now = timezone.now()
    with transaction.atomic(savepoint=False):  # the run's phase goes with the event, in the UPDATE that reserves its seq
        apply(tool_call.begin, actor=actor, idempotency_key=key, now=now, savepoint=False,
              columns=RunColumns(values={"phase": Phase.EXECUTING_TOOLS, "updated_at": now}))
    return key, reusable


def _instead_of_sending(tool_call: ToolCall, tool: Tool, *, assessed_now: bool, stop_at=None) -> Steps:
    """A step that returns the transitions (name, arguments) that settle the call instead of sending it;
    empty: send it.

    Writes nothing; the precondition and the ``reconcile`` hook may do I/O (``call_hook``).
    See ``execute_tool_call`` for when each check applies.
    """
    # The world may have changed since the proposal (or the approval). A
    # call sent again after a crash or an error is the same action under
    # the same key, not a new one: its own earlier effect must not deny it,
    # so where the tool can tell, that effect is looked for first.
    looked_up = tool_call.maybe_sent and tool.side_effect and tool.reconcile is not None
    if looked_up:
        found = yield from ask_reconcile(tool, tool_call)
        settled = _settled_as_found(found, "found at the external system before sending again")
        if settled is not None:
            return settled
    elif tool_call.maybe_sent or not tool.precondition or (assessed_now and not tool.side_effect):
        return []
    if tool.precondition is None:
        return []
    denial = yield from check_precondition(tool, ToolContext(
        run=tool_call.run, user=tool_call.run.requested_by, tool_call=tool_call), tool_call.arguments,
        stop_at=stop_at)
    if denial and looked_up:
        # The earlier send may have landed since it was looked up (a request
        # still on its way when its worker died): the "no" may be its own
        # effect. Looked up once more; still not found, it is ``unknown``
        # (reconciled), never ``denied``: that would say nothing was done.
        found = yield from ask_reconcile(tool, tool_call)
        settled = _settled_as_found(found, "found at the external system after its precondition said no")
        if settled is not None:
            return settled
        return [("mark_unknown", {"error": f"Sent before, not found at the external system, and its precondition "
                                           f"now says no ({denial}); the earlier send may still take effect."})]
    if denial:
        return [("deny", {"reason": "precondition checked before running", "error": denial})]
    return []


def _settled_as_found(found, reason: str) -> list | None:
    """The transitions that settle a call sent before as the external system ``found`` it (``succeeded``,
    ``failed``, or ``unknown`` when it could not be asked), each logged with ``reason``; None when it
    holds no trace of the call (``not_found``)."""
    asked = {"error": "Sent before; the external system is asked what became of it before sending again."}
    if found.status == "succeeded":
        return [("mark_unknown", asked), ("succeed", {"reason": reason, "result": found.result,
                                                      "now": timezone.now()})]
    if found.status == "failed":
        return [("mark_unknown", asked), ("fail", {
            "reason": reason, "now": timezone.now(),
            "error": found.error or "The external system reports that the call failed."})]
    if found.error:  # it could not be asked: never sent again blindly
        return [("mark_unknown", {"error": f"Could not ask the external system before sending again: "
                                           f"{found.error}"})]
    return None


def ask_reconcile(tool: Tool, tool_call: ToolCall) -> Steps:
    """Ask ``tool``'s ``reconcile`` hook what became of ``tool_call`` (sent under its idempotency key); a step
    (``call_hook``) that returns the ``Reconciliation``.

    The answer comes from an external system, so it is checked as a
    handler's result is (``_storable``): a ``succeeded`` whose result cannot
    be stored is no answer (``not_found`` with an error: nothing is
    guessed). A hook that raises is no answer either; its error names only
    the exception's type (the details, which may hold a URL with a key,
    stay in the log, masked). Never raises.
    """
    try:
        found = yield from call_hook(tool, tool.reconcile, tool_call.idempotency_key)
    except Exception as exc:
        log.warning("reconcile hook of %s raised: %s", tool_call.name, exc)
        return Reconciliation("not_found", error=f"The external system could not be asked ({type(exc).__name__}).")
    if found.status == "succeeded":
        problem = _storable(found.result)
        if problem:
            log.warning("reconcile hook of %s answered a result that cannot be stored: %s", tool_call.name, problem)
            return Reconciliation("not_found", error=f"The external system's answer cannot be stored ({problem}).")
    return found


def _storable(result) -> str:
    """Why ``result`` cannot be stored as a call's result (the exception's type name), or "" when it can."""
    try:
        json.dumps(result, allow_nan=False)  # strict JSON only: no Decimal, set, NaN...
        check_value(result, max_depth=MAX_RESULT_DEPTH)  # no NUL, lone surrogate or runaway nesting
    except (TypeError, ValueError, RecursionError) as exc:
        return type(exc).__name__
    return ""


def _key_and_reusable_result(tool_call: ToolCall, tool: Tool) -> tuple[str, tuple[int, object] | None]:
    """(key, reusable): the idempotency key to send ``tool_call`` under, and ``(call id, result)`` of a call
    that succeeded under that key (in the session, the run or anywhere: ``Tool.same_action``), whose result is
    reused instead of executing again (or None).

    One query at most. A call sent before keeps its key. Otherwise the key
    is the action's (``idempotency_key_base``), followed by ``-<n>`` after
    ``n`` definite failures under it when the tool's calls are deduplicated
    by key (side-effecting or ``idempotent`` tools): a fresh attempt must
    not be answered with the stored failure. Calls of other read-only tools
    are never deduplicated, not here and not by an external system, so
    nothing is counted for them. Only side-effecting calls reuse a result;
    reads are always done afresh.
    """
    run = tool_call.run
    key = tool_call.idempotency_key or idempotency_key_base(tool, run, tool_call.arguments,
                                                            identity=tool_call.action_key)
    numbered = not tool_call.idempotency_key and (tool.side_effect or tool.idempotent)
    if not numbered and not tool.side_effect:
        return key, None
    # Keys are the base or ``<base>-<n>``: one prefix match finds both kinds of earlier call.
    statuses = ([S.FAILED] if numbered else []) + ([S.SUCCEEDED] if tool.side_effect else [])
    # The action's identity (indexed) narrows a business key's scope, every call of the tool, at once.
    same = {"action_key": tool_call.action_key} if tool_call.action_key else same_action_scope(tool, run)
    earlier = _calls_under(key, statuses, same, other_than=tool_call.pk)
    if numbered:
        failures = sum(1 for _, status, _ in earlier if status == S.FAILED)
        key = f"{key}-{failures}" if failures else key
    reused = next((pk for pk, status, used in earlier if status == S.SUCCEEDED and used == key), None)
    if reused is None:
        return key, None
    return key, (reused, ToolCall.objects.values_list("result", flat=True).get(pk=reused))


_CALLS_UNDER: dict = {}  # (scope lookup, number of statuses) -> the statement of ``_calls_under``


def _calls_under(key: str, statuses: list[str], scope: dict, *, other_than: int) -> list[tuple[int, str, str]]:
    """``(id, status, idempotency key)`` of the calls other than ``other_than`` whose key starts with ``key``,
    whose status is one of ``statuses`` and that match ``scope`` (one lookup: ``action_key``, ``name``,
    ``run_id`` or ``run__session_id``, as ``same_action_scope`` gives), in id order: one statement whose
    SQL is built once per shape (the ORM built this one at every side effect, 0.5 ms of CPU)."""
    (lookup, value), = scope.items()
    shape = (lookup, len(statuses))
    sql = _CALLS_UNDER.get(shape) or _CALLS_UNDER.setdefault(shape, _calls_under_sql(lookup, len(statuses)))
    with connection.cursor() as cursor:
        cursor.execute(sql, [connection.ops.prep_for_like_query(key) + "%", *statuses, value, other_than])
        return cursor.fetchall()


def _calls_under_sql(lookup: str, statuses: int) -> str:
    """The statement of ``_calls_under`` for a scope ``lookup`` and that many statuses (the ORM's own
    ``startswith``: the backend's cast and ``LIKE`` operator, the value escaped by the caller)."""
    quote, calls, runs = connection.ops.quote_name, ToolCall._meta, Run._meta
    table = quote(calls.db_table)

    def column(meta, name):
        return f"{quote(meta.db_table)}.{quote(meta.get_field(name).column)}"

    key = connection.ops.lookup_cast("startswith", "CharField") % column(calls, "idempotency_key")
    join, scoped = {  # KeyError for a lookup that same_action_scope does not give
        "action_key": ("", column(calls, "action_key")), "name": ("", column(calls, "name")),
        "run_id": ("", column(calls, "run")),
        "run__session_id": (f" INNER JOIN {quote(runs.db_table)} ON {column(runs, 'id')} = {column(calls, 'run')}",
                            column(runs, "session")),
    }[lookup]
    return (f"SELECT {column(calls, 'id')}, {column(calls, 'status')}, {column(calls, 'idempotency_key')} "
            f"FROM {table}{join} WHERE {key} {connection.operators['startswith']} "
            f"AND {column(calls, 'status')} IN ({', '.join(['%s'] * statuses)}) AND {scoped} = %s "
            f"AND {column(calls, 'id')} <> %s ORDER BY {column(calls, 'id')}")


def _store_result(tool_call: ToolCall, tool: Tool, result, outcome) -> ToolCall:
    """Record a handler's return value: ``succeeded``, unless the value cannot be stored.

    A value that is not strict JSON (``Decimal``, NaN, a NUL character, a
    lone surrogate, nesting deeper than ``MAX_RESULT_DEPTH``:
    ``config.strict_json.check_value``) or that the database refuses is a
    deterministic error, never retried: a
    side-effecting call becomes ``unknown`` (its effect may well have
    happened; reconciliation finds out), a read-only one ``failed``.
    ``outcome(transition, **arguments)`` stores an outcome.
    """
    problem = _storable(result)
    if not problem:
        try:
            return outcome(tool_call.succeed, result=result, now=timezone.now())
        except (DataError, IntegrityError) as exc:
            problem = type(exc).__name__
    log.warning("tool %s returned a result that cannot be stored: %s", tool_call.name, problem)
    run = tool_call.run
    tool_call.refresh_from_db()
    tool_call.run = run  # refresh_from_db drops the cached run: the next outcome logs through the same instance
    error = f"The tool returned a result that cannot be stored ({problem})."
    if tool.side_effect:
        return outcome(tool_call.mark_unknown, error=error)
    return outcome(tool_call.fail, error=error, now=timezone.now())


def retry_delay(tool_call: ToolCall) -> float:
    """Seconds to wait before the next attempt: full jitter on ``backoff_s * 2**(attempts-1)``
    (``runs.base.awaiting.full_jitter``)."""
    return full_jitter(get_tool(tool_call.name).backoff_s, tool_call.attempts)


def charged_attempts(tool_call: ToolCall) -> int:
    """How many sends of ``tool_call`` count against its tool's ``max_attempts``: ``attempts`` less the sends cut off as a
    bystander (``recovery`` events with ``"blamed": false``; docs/design.md#recovery-and-the-sweeper). One query.
    """
    if not tool_call.attempts:
        return 0
    spared = sum(1 for payload in RunEvent.objects.filter(run_id=tool_call.run_id, type="recovery")
                 .values_list("payload", flat=True)
                 if payload.get("blamed") is False and tool_call.pk in payload.get("tool_calls", []))
    return tool_call.attempts - spared


def recover_orphaned_call(tool_call: ToolCall, *, actor: str, spare_attempts: bool = False) -> ToolCall:
    """A call found ``running`` by a worker that just took the run's lease (its caller died); returns it.

    Read-only and idempotent tools are sent again (``ready``, same key) while ``charged_attempts < max_attempts``,
    or whatever their attempts with ``spare_attempts`` (a bystander's death); otherwise a read-only call fails and a
    side-effecting one becomes ``unknown``. Its target's waiters are woken (docs/design.md#recovery-and-the-sweeper).
    """
    tool = get_tool(tool_call.name)
    with transaction.atomic():  # it no longer holds its target: its waiters are woken with the move
        _move_orphan(tool_call, tool, actor=actor, spare_attempts=spare_attempts)
        if tool is not None:
            release(tool_call, tool, actor=actor)
    return tool_call


def _move_orphan(tool_call: ToolCall, tool: Tool | None, *, actor: str, spare_attempts: bool) -> ToolCall:
    """``recover_orphaned_call``'s transition: ``ready`` to be sent again, ``failed`` or ``unknown``."""
    resendable = tool is not None and (not tool.side_effect or tool.idempotent)
    if resendable and (spare_attempts or charged_attempts(tool_call) < tool.max_attempts):
        return apply(tool_call.requeue, actor=actor, reason="retrying after a worker crash",
                     error="The worker running this call stopped; sending it again.")
    if not tool_call.side_effect:
        return apply(tool_call.fail, actor=actor, reason="worker crashed during every attempt",
                     error=f"The worker stopped during each of {tool_call.attempts} attempts.",
                     now=timezone.now())
    return apply(tool_call.mark_unknown, actor=actor, reason="worker crashed during the call",
                 error=f"The worker stopped during this call (attempt {tool_call.attempts}); "
                       "its outcome is unknown.")
