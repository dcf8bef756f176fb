"""The agent loop: advance one run until it waits, ends, or is cancelled.

Each pass of ``advance`` looks at what the database says and does the one
next thing, committing before the next pass:

1. cancel requested -> cancel; deadline passed -> fail (the safe point);
2. tool calls ``ready`` -> execute them (a waiting tool's call first waits
   for what it asks: ``tools.waits``);
3. tool calls ``unknown`` -> reconcile (the tool's hook, else a person);
4. tool calls awaiting approval -> ``waiting/approval``;
5. finished tool calls without a result message -> deliver their results;
6. a final answer stored but not yet judged -> the completion check;
7. budgets -> call the model -> record the step -> propose its tool calls,
   or, for a final answer, ask the completion check.

Because every decision is re-derived from stored state, a worker that
picks the run up later (after an approval, or another worker's crash)
continues from the same point. Within one slice the worker reads the run's
event counter before every pass, and the run's row and the rest (calls,
history, steps) again only when another writer logged an event meanwhile
(``runs.engine.state``).

Writes per step: one transaction before the external call (the ``Step``
row, or the call's ``running`` with its idempotency key) and one after it
(the answer with its calls and message, or the call's outcome with its
result message); no transaction stays open across a model or tool call.
"""

import asyncio
import logging
from datetime import timedelta

from django.conf import settings
from django.db import DataError, IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from django_fsm import can_proceed

from runs import lease

from runs.base import log_context, process_metrics, selects, tracing
from runs.base.awaiting import Await, Interrupted, Steps, commit_point, drive, full_jitter
from runs.engine import completion
from runs.engine.budgets import cost_usd as _cost_usd
from runs.engine.budgets import deadline_of, deadline_passed
from runs.engine.budgets import exhausted_budget as _exhausted_budget
from runs.base.failpoints import failpoint
from runs.base.model_output import MAX_CALL_ID_LENGTH, RefusedText, screen_response, storable_errors
from runs.models import FailureType, Phase, Run, RunStatus, Step, WaitingReason
from runs.providers import ModelError, ModelRequest, get_client
from runs.base.model_call import ConfigError
from runs.base.model_call import MalformedResponse as _MalformedResponse
from runs.base.model_call import StreamInterrupted
from runs.engine.recovery import recover_after_takeover
from approvals.services import request_approval, request_reconciliation
from runs.engine.context import build_context
from runs.engine.lifecycle import begin_run, end_run, ending_reads
from runs.engine.state import Known
from runs.engine.wire_names import on_the_wire, real_names
from runs.live import DeltaBuffer, publish_delta
from runs.services import RunColumns, append_event, append_message, new_message, set_phase, writes_held
from runs.transitions import apply
from runs.tx import relock
from runs.wakeups import wake_on_commit
from tools import waits
from tools.models import ToolCall, ToolCallStatus, WaitStatus
from tools.registry import get_tool
from tools.services import (
    Reconciled,
    assess_tool_calls,
    deliver_tool_results,
    execute_tool_call,
    propose_tool_calls,
    reconcile_delay,
    reconcile_unknown_call,
    retry_delay,
    settle_joined_calls,
    tool_result_messages,
)

log = logging.getLogger(__name__)
ACTOR = "worker"
S = ToolCallStatus
# Steps one actor invocation takes before handing the run back to the queue.
SLICE_STEPS = 50
# Longest pause (seconds) between two looks at an original pending in another run.
MAX_ORIGINAL_POLL_S = 3600


def advance(run_id: int) -> Run | None:
    """Advance run ``run_id`` as far as it can go without a person, under its lease (None: another worker holds it).

    Returns the run as left (waiting, terminal, or handed back after ``SLICE_STEPS`` steps). Raises ``LeaseLost`` if the
    lease was taken over meanwhile (nothing written after that was saved).
    """
    held = lease.acquire(run_id, reading=RUN_READING)
    if held is None:
        return None
    with lease.holding(held), log_context.bound(run_id):
        run, more = drive(advance_slice(run_id, held.run))
    hand_back(run_id, more=more, released=None)
    return run


def hand_back(run_id: int, *, more: bool, released: str | None) -> None:
    """After a slice whose lease was released: wake the run again if it has ``more`` to do, or if it was
    left running with nobody on it (a decision or timer resumed it while this worker held the lease,
    and its wake-up was refused). ``released``: the run's status as ``runs.lease.release`` left it, or
    None when that found the lease no longer this worker's (then the row is asked)."""
    if released is None:
        try:
            status, lease_expires_at = selects.values_one(Run, {"pk": run_id}, ("status", "lease_expires_at"))
        except Run.DoesNotExist:
            status, lease_expires_at = None, None
        nobody_on_it = status == RunStatus.RUNNING and lease_expires_at is None
    else:
        nobody_on_it = released == RunStatus.RUNNING
    if more or nobody_on_it:
        wake_on_commit(run_id)  # hand the run back to the queue so other runs get a turn


# How a slice reads its run: with its agent, session and requester, and whether a step of it is in flight.
RUN_READING = selects.Reading(Run, related=("agent", "session", "requested_by"),
                              flags={"steps_in_flight": (Step, "run", {"status": Step.Status.STARTED})})


def advance_slice(run_id: int, run: Run | None = None) -> Steps:
    """Up to ``SLICE_STEPS`` steps under the lease (held by the caller); a step (``runs.base.awaiting``)
    that returns (run, whether it has more to do). ``run``: the run as its lease was taken with it
    (``runs.lease.acquire(reading=RUN_READING)``, nothing written since); None: read here."""
    if run is None:
        run = RUN_READING.one(run_id)
    log_context.note(session_id=run.session_id, **tracing.log_ids(run))
    known = Known(run)
    if run.status == RunStatus.QUEUED:  # never started: nothing of it can be in flight
        if not can_proceed(run.start):  # a cancel was requested
            return run, False
        if run.wake_at is not None and run.wake_at > timezone.now():
            return run, False  # created with a later start_at: the sweeper wakes it then
        begun = begin_run(run, actor=ACTOR)
        if begun is None:
            return run, False  # an older run of the session goes first; its end wakes this one
        known.started(history=[begun.message] if begun.alone else None)
    else:
        seq = run.last_event_seq
        in_flight = None if run.steps_in_flight else []  # read only when the run's row says some exist
        if recover_after_takeover(run, actor=ACTOR, calls=known.calls, steps=in_flight) == FailureType.CRASH_LOOP:
            limit = settings.TOLLGATE["MAX_CRASHES_PER_STEP"]
            return _end(run.fail, reason="crash loop", failure_type=FailureType.CRASH_LOOP,
                        error=f"A worker died {limit} times in a row on the same step; the run was stopped."), False
        if run.last_event_seq != seq:  # a death was counted: durable before anything that may die again
            yield commit_point()
    for _ in range(SLICE_STEPS):
        known.revalidate()
        if run.status != RunStatus.RUNNING:
            return run, False
        if run.cancel_requested_at is not None:
            return _end(run.cancel, reason="cancelled at a safe point"), False
        passed = deadline_passed(run)
        if passed:
            _fail(run, *passed)
            return run, False
        try:
            going_on = yield from process_metrics.timed_step(_step(run, known))
        except Interrupted:  # a hook or a pause cut short by the run's cancel or deadline: the next pass ends it
            known.reload()
            continue
        if not going_on:
            return run, False
    return run, True


def _step(run: Run, known: Known) -> Steps:
    """Do the one next thing for a running run; False when the run stopped running."""
    calls = known.calls
    ready = [c for c in calls if c.status == S.READY]
    if ready:
        return (yield from _execute(run, known, ready[0]))
    if any(c.status == S.UNKNOWN for c in calls):
        return (yield from _reconcile(run, [c for c in calls if c.status == S.UNKNOWN]))
    if any(c.status == S.AWAITING_APPROVAL for c in calls):
        if _wait_for_approval(run):
            return False
        known.forget()  # a decision came first: the calls changed
        return True
    if any(c.status == S.PROPOSED and c.duplicate_of_id for c in calls):
        waiting = settle_joined_calls(run)
        known.forget()  # settled through instances of their own
        if waiting:
            return _wait_for_original(run, waiting)
    known.messages_added(deliver_tool_results(run, calls=known.calls, history=known.history,
                                              never_asked=known.assessed_here))
    last = next((m for m in reversed(known.history) if m.run_id == run.pk), None)
    if last is not None and last.role == "assistant" and not last.tool_calls and last.content.strip():
        # A final answer is stored but was never judged (its worker died):
        # judge it now rather than asking the model again.
        set_phase(run, Phase.FINALIZING)
        return _finish(run, known, last.content)
    return (yield from _model_turn(run, known))


def _execute(run: Run, known: Known, call: ToolCall) -> Steps:
    """Execute one ready call; after a retryable failure, back off (inline or by waiting).

    A call of a waiting tool (``Tool.wait``) runs only once its wait is
    settled; until then the run waits for it. Once no call of the run owes
    a result any more, the results go into the history in the transaction
    that stores this call's outcome.
    """
    tool = get_tool(call.name)
    if tool is not None and tool.wait is not None and not _wait_settled(run, call, tool):
        return False
    failpoint("tool_call_ready", call.name)
    delivered = []

    def streaks_over() -> RunColumns | None:  # with the outcome: the call got through an attempt
        if run.crash_streak or run.loss_streak or run.suspect or run.death_blame:
            # The streaks are over, and any death counted is behind it (put back if the outcome is refused).
            return RunColumns(values={"crash_streak": 0, "loss_streak": 0, "suspect": False, "death_blame": ""})
        return None

    def with_outcome(call: ToolCall) -> list:  # inside the outcome's transaction, before its fenced statement
        owing = any(c.is_pending for c in known.calls)
        # The results, stored by the outcome's statement (once no call owes one).
        messages = [] if owing else tool_result_messages(run, calls=known.calls, history=known.history,
                                                         never_asked=known.assessed_here)
        delivered[:] = messages
        return messages

    waited = []

    def on_target_busy(holder: int, target) -> None:  # in the transaction that found the target held
        relock(run)
        _wait_locked(run, reason=f"{call.name} waits for call #{holder} on {target.label}",
                     waiting_reason=WaitingReason.RETRY_BACKOFF,
                     wake_at=timezone.now() + timedelta(seconds=settings.TOLLGATE["LEASE_TTL_S"]))
        waited.append(holder)

    # Proposed ready by this worker in this slice: a read's precondition ran a moment ago.
    log_context.note(tool_call_id=call.pk)  # its handler's log lines, and the engine's about it, carry the call
    log.debug("tool call %s (%s): executing", call.pk, call.name)
    span = tracing.start_tool_span(run, call)
    try:
        call = yield from execute_tool_call(call, actor=ACTOR, with_outcome=with_outcome, run_columns=streaks_over,
                                            on_target_busy=on_target_busy,
                                            assessed_now=call.pk in known.assessed_here, stop_at=deadline_of(run))
    except BaseException as exc:
        tracing.end_tool_span(span, error=exc)
        raise
    finally:
        log_context.note(tool_call_id=None)
    tracing.end_tool_span(span, call=call)
    log.debug("tool call %s (%s): %s after %s attempt(s)", call.pk, call.name, call.status, call.attempts)
    if waited:  # the holder's outcome wakes the run (its wake_at, a lease TTL away, if that is lost)
        return False
    known.messages_added(delivered)
    if call.attempts:  # sent: its effect, or anyone's while it was out, may change what the next reads rely on
        known.call_sent()
        if call.side_effect and writes_held(run):
            # What became of an effect that may have happened is durable before the next pass: a group commit
            # would otherwise undo it with whatever fails next in the same job, and the takeover could only
            # call it unknown.
            yield commit_point()
    if call.status != S.READY:
        return True
    delay = retry_delay(call)
    if delay <= settings.TOLLGATE["INLINE_BACKOFF_MAX_S"]:
        yield Await(start=lambda: asyncio.sleep(delay), what="pause", stop_at=deadline_of(run))
        return True
    _wait(run, reason=f"retrying {call.name} in {delay:.1f}s", waiting_reason=WaitingReason.RETRY_BACKOFF,
          wake_at=timezone.now() + timedelta(seconds=delay))
    return False


def _reconcile(run: Run, unknown: list[ToolCall]) -> Steps:
    """Settle unknown outcomes: the tool's hook first (a call it may send again is ``ready`` for the next
    pass), else a person; the run waits meanwhile."""
    verdicts = {}
    for call in unknown:
        log_context.note(tool_call_id=call.pk)
        try:
            verdicts[call.pk] = yield from reconcile_unknown_call(call, actor=ACTOR, resend=True)
        finally:
            log_context.note(tool_call_id=None)
        log.debug("tool call %s (%s): outcome unknown, reconciled: %s", call.pk, call.name, verdicts[call.pk])
    later = [call for call in unknown if verdicts[call.pk] == Reconciled.LATER]
    people = [call for call in unknown if verdicts[call.pk] == Reconciled.PERSON]
    if not later and not people:
        return True
    with transaction.atomic():
        for call in people:
            request_reconciliation(tool_call=call)
        wake_at = timezone.now() + timedelta(seconds=min(reconcile_delay(c) for c in later)) if later else None
        _wait(run, reason="a tool call's outcome is unknown", waiting_reason=WaitingReason.RECONCILIATION,
              wake_at=wake_at)
    return False


def _wait_for_original(run: Run, joined: list[ToolCall]) -> bool:
    """Re-proposed actions wait for an original still pending in another run (being reconciled).

    The run waits ``reconciliation`` and looks again after ``RECONCILE_BACKOFF_S``,
    doubling with every look at the same originals (at most ``MAX_ORIGINAL_POLL_S``),
    so an original that only a person can settle costs a look an hour, not one a
    second. Each wait's event records the originals' ids (``payload["originals"]``,
    sorted); the looks are counted from them.
    """
    originals = sorted({call.duplicate_of_id for call in joined})
    looks = run.events.filter(type=run.event_type, payload__originals=originals).count()
    delay = min(settings.TOLLGATE["RECONCILE_BACKOFF_S"] * 2 ** looks, MAX_ORIGINAL_POLL_S)
    named = ", ".join(f"#{call.duplicate_of_id}" for call in joined)
    _wait(run, reason=f"same action as {named}, whose outcome is not settled yet",
          waiting_reason=WaitingReason.RECONCILIATION, wake_at=timezone.now() + timedelta(seconds=delay),
          payload={"originals": originals})
    return False


def _wait(run: Run, *, reason: str, waiting_reason: str, wake_at=None, payload: dict | None = None) -> None:
    """Put the run to wait under its row lock, as ``cancel_run`` takes it; a cancel accepted meanwhile ends it ``cancelled``.
    ``payload`` is added to the wait's event."""
    with transaction.atomic():
        relock(run)
        _wait_locked(run, reason=reason, waiting_reason=waiting_reason, wake_at=wake_at, payload=payload)


def _wait_locked(run: Run, *, reason: str, waiting_reason: str, wake_at=None, payload: dict | None = None) -> None:
    """``_wait`` for a caller whose transaction holds the run's row lock (``runs.tx.relock``)."""
    if not can_proceed(run.wait):
        _end(run.cancel, reason="cancelled at a safe point (before waiting)")
        return
    apply(run.wait, actor=ACTOR, reason=reason, waiting_reason=waiting_reason, wake_at=wake_at, payload=payload,
          savepoint=False)


def _wait_settled(run: Run, call: ToolCall, tool) -> bool:
    """True once ``call``'s wait is settled (execute it now); else the run waits for it and False.

    The wait is opened on the first look (``waits.open_wait``), in the
    transaction that puts the run to wait with ``wake_at`` = its deadline.
    """
    with transaction.atomic():
        wait = waits.wait_of(call) or waits.open_wait(run, call, tool, actor=ACTOR)
        if wait.status != WaitStatus.PENDING:
            return True
        _wait(run, reason=f"{call.name} waits ({wait.kind})", waiting_reason=wait.kind, wake_at=wait.deadline)
    return False


def _wait_for_approval(run: Run) -> bool:
    """Put the run in ``waiting/approval`` unless a decision came in first; True if it waits."""
    with transaction.atomic():
        relock(run)  # decisions take the lock too
        if not selects.exists(ToolCall, {"run": run.pk, "status": S.AWAITING_APPROVAL}):
            return False
        _wait_locked(run, reason="a tool call needs approval", waiting_reason=WaitingReason.APPROVAL)
    return True


def _end(ending, *, reason: str, **kwargs) -> Run:
    return end_run(ending, actor=ACTOR, reason=reason, **kwargs)


def _fail(run: Run, failure_type: str, error: str) -> bool:
    _end(run.fail, reason=error, failure_type=failure_type, error=error)
    return False


def _model_turn(run: Run, known: Known) -> Steps:
    """Call the model once and act on its answer; False when the run stopped running."""
    agent = run.agent
    exhausted = _exhausted_budget(run, steps=known.steps)
    if exhausted:
        return _fail(run, *exhausted)
    request, summary, deltas, back = _model_request(run, known.history)
    step = Step(run=run, index=known.steps, request=summary)
    set_phase(run, Phase.CALLING_MODEL, insert=step)  # fenced: no step is stored for a lease taken over
    known.step_added()
    try:
        # Untrusted: made storable, bad calls marked, before anything is written.
        with storable_errors():
            client = get_client(agent.model)
            limit_s = settings.TOLLGATE["MODEL_CALL_MAX_S"]

            def start():  # once the step is committed
                failpoint("model_call_started")
                return process_metrics.timed_model_call(client.complete(request), agent.model)

            span = tracing.start_model_span(run, agent.model, request)
            try:
                answer = yield Await(start=start, timeout_s=limit_s,
                                     timed_out=lambda: ModelError(f"The model did not answer within {limit_s:g} s.",
                                                                  transient=True),
                                     stop_at=deadline_of(run), what="model")
                deltas.flush()  # the stream's last events
                real_names(answer.tool_calls, back)
                response = screen_response(answer)
            except BaseException as exc:
                tracing.end_model_span(span, error=exc)
                raise
            tracing.end_model_span(span, response=response)
    except Interrupted as exc:  # the run ends at the next pass (its cancel, its deadline)
        apply(step.discard, actor=ACTOR, reason=f"discarded: {exc}", error=f"Stopped waiting for the answer: {exc}.",
              now=timezone.now())
        return True
    except _MalformedResponse as exc:
        return _malformed_response(run, known, step, exc)
    except StreamInterrupted as exc:
        return _interrupted_stream(run, step, exc)
    except (ModelError, ConfigError) as exc:
        if getattr(exc, "transient", False):
            return (yield from _model_backoff(run, step, client, exc))
        with transaction.atomic():
            apply(step.fail, actor=ACTOR, reason="failed", payload={"error": _readable(exc)}, error=_readable(exc),
                  server=_server_answer(exc), now=timezone.now())
            return _fail(run, FailureType.MODEL_ERROR, _readable(exc))

    cost = _call_cost(agent, response)
    log.debug("model call of step %s: %s tool call(s), %s input and %s output tokens", step.index,
              len(response.tool_calls), response.input_tokens, response.output_tokens)
    if response.tool_calls:
        _unique_call_ids(step, response.tool_calls, used=known.session_call_ids)
    # Policy first, outside the transaction: preconditions may do I/O.
    try:
        assessments = yield from assess_tool_calls(run=run, calls=response.tool_calls, stop_at=deadline_of(run),
                                                   truncated=response.finish_reason == "length")
    except Interrupted as exc:  # a precondition cut short: the answer is dropped, the run ends at the next pass
        apply(step.discard, actor=ACTOR, reason=f"discarded: {exc}",
              error=f"Stopped waiting for a tool's precondition: {exc}.", now=timezone.now())
        return True
    try:
        going_on = _record_model_answer(run, known, step, response, cost, assessments)
    except (DataError, IntegrityError) as exc:
        # Deterministic: the same output would be refused again. Never a
        # crash-and-retry loop; the answer is invalid output.
        log.warning("run %s: the database refused the model's answer: %s", run.pk, exc)
        step.refresh_from_db()  # what the rolled-back transaction wrote in memory is gone
        known.reload()
        return _malformed_response(run, known, step, f"the answer could not be stored ({type(exc).__name__})")
    if going_on is not None:
        return going_on
    yield commit_point()  # a final answer is durable before it is judged: a crash then is not asked again
    failpoint("model_call_returned", response.finish_reason)
    if not response.content.strip():
        return _repair_turn(run, known, "the model returned neither text nor tool calls",
                            tell="Your last reply was empty. Answer or call a tool.")
    return _finish(run, known, response.content, read_upto=step.request.get("last_message_id"))


def _readable(exc: Exception) -> str:
    """What the step, its event and the run keep of a provider error, readable by whoever may read the run:
    ``ModelError.readable()`` (the server's own words included), else the ``ConfigError``'s text."""
    return exc.readable() if isinstance(exc, ModelError) else str(exc)


def _server_answer(exc: Exception) -> dict | None:
    """``ModelError.server_answer()`` (the model server's status and message), ``None`` for anything else."""
    return exc.server_answer() if isinstance(exc, ModelError) else None


# Longest backoff (seconds) before a model call is tried again, whatever the server's Retry-After says.
MAX_MODEL_BACKOFF_S = 3600


def _model_backoff(run: Run, step: Step, client, exc: ModelError) -> Steps:
    """A transient provider error (``ModelError.transient``): the step fails and the model is asked again later.

    The next try comes after the server's ``retry_after_s`` when it gave
    one, else after ``MODEL_BACKOFF_S * 2**(tries-1)`` seconds with full
    jitter; at most ``MAX_MODEL_BACKOFF_S``. Up to ``INLINE_BACKOFF_MAX_S``
    it is paused inline, else the run waits ``retry_backoff`` (holding no
    process) until then. After the client's ``max_retries`` (the agent's
    config, default ``MODEL_MAX_RETRIES``) tries again in a row, the run
    fails ``model_error`` with the provider's message.
    """
    retries = getattr(client, "max_retries", settings.TOLLGATE["MODEL_MAX_RETRIES"])
    tries = _transient_failures_in_a_row(run, before=step, limit=retries) + 1
    if tries > retries:
        message = f"{_readable(exc)} (gave up after {retries} retries)"
        with transaction.atomic():
            apply(step.fail, actor=ACTOR, reason="failed", payload={"error": message}, error=_readable(exc),
                  server=_server_answer(exc), now=timezone.now(), transient=True)
            return _fail(run, FailureType.MODEL_ERROR, message)
    apply(step.fail, actor=ACTOR, reason="failed, will retry", payload={"error": _readable(exc), "transient": True},
          error=_readable(exc), server=_server_answer(exc), now=timezone.now(), transient=True)
    delay = exc.retry_after_s
    if delay is None:
        delay = full_jitter(settings.TOLLGATE["MODEL_BACKOFF_S"], tries)
    delay = min(delay, MAX_MODEL_BACKOFF_S)
    if delay <= settings.TOLLGATE["INLINE_BACKOFF_MAX_S"]:
        yield Await(start=lambda: asyncio.sleep(delay), what="pause", stop_at=deadline_of(run))
        return True
    _wait(run, reason=f"the model is unavailable ({exc}); trying again in {delay:.1f}s",
          waiting_reason=WaitingReason.RETRY_BACKOFF, wake_at=timezone.now() + timedelta(seconds=delay))
    return False


def _transient_failures_in_a_row(run: Run, *, before: Step, limit: int) -> int:
    """How many of ``run``'s steps just ``before`` that one failed transiently, in a row (``limit`` at most)."""
    tries = 0
    earlier = run.steps.filter(index__lt=before.index).order_by("-index")
    for status, response in earlier.values_list("status", "response")[:limit]:
        if status != Step.Status.FAILED or not (response.get("error") or {}).get("transient"):
            break
        tries += 1
    return tries


def _record_model_answer(run: Run, known: Known, step: Step, response, cost, assessments) -> bool | None:
    """Store one model answer with its usage and tool calls in one transaction.

    Returns whether the run goes on after a turn with tool calls, or None
    for a final answer (left in phase ``finalizing`` until it is judged) or
    an empty one: the caller acts on those.
    """
    final = not response.tool_calls and bool(response.content.strip())
    going_on = None
    now = timezone.now()
    # The run's usage counters go with the step's event, in the UPDATE that reserves its seq; the
    # instance takes them too: it stays what the row holds (runs.engine.state) and is what the
    # commit's live push shows (runs.live).
    finalizing = {"phase": Phase.FINALIZING, "updated_at": now} if final else {}
    usage = RunColumns(
        values={"crash_streak": 0, "loss_streak": 0, "suspect": False, "death_blame": "", **finalizing},
        increments={"model_calls": 1, "input_tokens": response.input_tokens,
                    "output_tokens": response.output_tokens, "cost_usd": cost},
    )
    message = new_message(run, role="assistant", content=response.content, tool_calls=[
        {"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in response.tool_calls
    ])
    with transaction.atomic():
        apply(step.succeed, actor=ACTOR, reason=response.finish_reason,
              payload={"tool_calls": len(response.tool_calls), "input_tokens": response.input_tokens,
                       "output_tokens": response.output_tokens, "cost_usd": str(cost)},
              response=response.as_dict(), input_tokens=response.input_tokens,
              output_tokens=response.output_tokens, cost_usd=cost, now=timezone.now(), savepoint=False,
              columns=usage, inserts=lambda _step: [message])  # the answer's message in the step's statement
        created = []
        if response.tool_calls:
            created = propose_tool_calls(run=run, step=step, calls=response.tool_calls, assessments=assessments,
                                         actor=ACTOR)
            for call, assessment in zip(created, assessments):  # the inbox items, in the proposal's transaction
                if call.status == S.AWAITING_APPROVAL:
                    request_approval(tool_call=call, tool=get_tool(call.name), rule=assessment.rule)
            going_on = True
            if all(c.status == S.INVALID for c in created):
                going_on = _repair_turn(run, known, "every tool call of the turn was invalid")
    known.messages_added([message])
    known.calls_added(created)
    return going_on


def _unique_call_ids(step: Step, calls: list[dict], *, used: set[str]) -> None:
    """Give every call of the turn an id unique in the session, in place, before anything stores it.

    Some servers omit ids or reuse ``call_0`` on every turn (and every run
    starts its turns afresh); the stored message, the ToolCall and the tool
    result must all name the same call, and the session's history must never
    hold two calls under one id. ``used``: the ids the session's calls have
    (not changed here).
    """
    used = set(used)
    for index, call in enumerate(calls):
        call_id = call.get("id") or f"call_{step.pk}_{index}"
        if call_id in used:
            call_id = f"{call_id}_{step.pk}_{index}"
            if len(call_id) > MAX_CALL_ID_LENGTH:
                call_id = f"call_{step.pk}_{index}"
        used.add(call_id)
        call["id"] = call_id


def _count(run: Run, counter: str) -> int:
    """Add one to ``counter`` (a Run field) under the lease; returns the new count. Call inside a transaction."""
    lease.check(run.pk)
    Run.objects.filter(pk=run.pk).update(**{counter: F(counter) + 1})
    count = Run.objects.values_list(counter, flat=True).get(pk=run.pk)
    setattr(run, counter, count)
    return count


def _strike(run: Run, known: Known, *, counter: str, limit: int, event: str, reason: str, tell: str = "") -> bool:
    """Count one more ``counter`` (a Run field) for ``run``; False once it passes ``limit``.

    Within the limit the strike is logged as event ``event`` and, with
    ``tell``, the model is told through a runtime message.
    """
    told = []
    with transaction.atomic():
        count = _count(run, counter)
        if count > limit:
            return False
        append_event(run, type=event, actor=ACTOR, reason=reason, payload={counter: count})
        if tell:
            told.append(append_message(run, role="system", content=tell, fence=False))
    known.messages_added(told)
    return True


def _repair_turn(run: Run, known: Known, why: str, tell: str = "") -> bool:
    """Count a turn of invalid output; fail the run once the repair budget is spent."""
    limit = settings.TOLLGATE["MAX_REPAIR_TURNS"]
    if _strike(run, known, counter="repair_turns", limit=limit, event="repair", reason=why, tell=tell):
        return True
    return _fail(run, FailureType.INVALID_MODEL_OUTPUT, f"Invalid model output after {limit} repair turns: {why}.")


def _finish(run: Run, known: Known, content: str, *, read_upto: int | None = None) -> bool:
    """The model gave a final answer (the run is in phase ``finalizing``): the completion check decides.

    A cancel requested before the verdict is committed wins: the run ends
    ``cancelled`` (the answer stays in the history), never ``completed``.
    ``read_upto``: the ``last_message_id`` the answering model call read,
    when the caller knows it; then, if no other writer logged an event on
    the run meanwhile, the ending takes what the loop knows of the run
    instead of reading it again (``lifecycle.ending_reads``).
    """
    verdict = completion.evaluate(run)
    if verdict.complete:
        with transaction.atomic():
            unchanged = relock(run)
            if not can_proceed(run.complete):  # a cancel was accepted first: it wins
                _end(run.cancel, reason="cancelled before the final answer was accepted")
                return False
            reads = (ending_reads(run, calls=known.calls, history=known.history, read_upto=read_upto)
                     if unchanged and read_upto is not None else None)
            _end(run.complete, reason=f"{verdict.outcome}: {verdict.reason}", outcome=verdict.outcome,
                 outcome_reason=verdict.reason, final_output=content, reads=reads)
        return False
    limit = settings.TOLLGATE["MAX_INCOMPLETE_NUDGES"]
    if _strike(run, known, counter="incomplete_nudges", limit=limit, event="incomplete", reason=verdict.reason,
               tell=f"The task is not complete: {verdict.reason}"):
        return True
    return _fail(run, FailureType.INCOMPLETE, f"Not complete after {limit} reminders: {verdict.reason}")


def _model_request(run: Run, history: list) -> tuple[ModelRequest, dict, DeltaBuffer, dict[str, str]]:
    """The request for ``run``'s next model call (``history``: the session's messages), its summary, the
    buffer of its streaming deltas, and ``{name on the wire: registered name}`` for the tool names a model
    API refuses (``runs.engine.wire_names``: read the answer's calls back with it).

    The summary goes to ``Step.request``; streaming deltas go to the run's
    Channels group, coalesced (``runs.live.DeltaBuffer``: flush it once the
    call answered).
    """
    context = build_context(run, history)
    deltas = DeltaBuffer(run.pk, push=publish_delta)
    tools, messages, back = on_the_wire(context.tools, context.messages)
    request = ModelRequest(
        instructions=context.instructions,
        messages=messages,
        tools=tools,
        turn_index=run.model_calls,
        run_id=run.pk,
        on_delta=deltas.add,
    )
    summary = {"turn_index": request.turn_index, "messages": len(context.messages),
               "last_message_id": context.last_message_id,
               "omitted_messages": context.omitted, "estimated_tokens": context.estimated_tokens}
    return request, summary, deltas, back


def _call_cost(agent, response):
    """US dollars of one call (``Decimal``), by ``TOLLGATE["MODEL_PRICES"]``."""
    return _cost_usd(agent.model, input_tokens=response.input_tokens, output_tokens=response.output_tokens)


def _malformed_response(run: Run, known: Known, step: Step, exc: Exception) -> bool:
    """A response that could not be understood: the step ``failed`` (counts toward ``max_model_calls``, not ``max_turns``),
    a repair turn spent (past ``MAX_REPAIR_TURNS``: ``invalid_model_output``); ``RefusedText`` is told to the model.
    """
    apply(step.fail, actor=ACTOR, reason="malformed response", payload={"error": str(exc)}, error=str(exc),
          now=timezone.now())
    return _repair_turn(run, known, f"malformed response ({exc})",
                        tell=str(exc) if isinstance(exc, RefusedText) else "")


def _interrupted_stream(run: Run, step: Step, exc: Exception) -> bool:
    """Half an answer arrived: discard the step and ask again, at most ``MAX_REPAIR_TURNS`` times.

    The discarded step counts toward ``max_model_calls``; past the limit
    the run fails with ``model_error``.
    """
    limit = settings.TOLLGATE["MAX_REPAIR_TURNS"]
    with transaction.atomic():
        count = _count(run, "repair_turns")
        apply(step.discard, actor=ACTOR, reason=f"discarded: {exc}", payload={"repair_turns": count}, error=str(exc),
              now=timezone.now())
    if count <= limit:
        return True
    return _fail(run, FailureType.MODEL_ERROR, f"The model's stream broke off {limit + 1} times: {exc}")
