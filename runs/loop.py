"""The agent loop: advance one run until it waits, ends, or is cancelled.

Each pass of ``advance`` looks at what the database says and does the one
next thing, committing before the next pass:

1. cancel requested -> cancel (the safe point);
2. tool calls ``ready`` -> execute them;
3. tool calls awaiting approval -> ``waiting/approval``;
4. finished tool calls without a result message -> deliver their results;
5. budgets -> call the model -> record the step -> propose its tool calls,
   or, for a final answer, ask the completion check.

Because every decision is re-derived from stored state, a worker that
picks the run up later (after an approval, or another worker's crash)
continues from the same point.
"""

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs import completion
from runs.models import FailureType, Message, Phase, Run, RunStatus, Step, WaitingReason
from runs.providers import ModelError, ModelRequest, get_client
from runs.providers.base import ConfigError
from runs.services import append_event, append_message, cancel_run, set_phase, transition_run
from tools.models import ToolCall, ToolCallStatus
from tools.registry import tools_for_agent
from tools.services import execute_tool_call, propose_tool_calls, tool_result_content

log = logging.getLogger(__name__)
ACTOR = "worker"
S = ToolCallStatus


def advance(run_id: int) -> Run:
    """Advance run ``run_id`` as far as it can go without a person.

    Returns the run as it was left (waiting, terminal, or — if another
    writer changed it — whatever the database says now).
    """
    run = Run.objects.select_related("agent", "session").get(pk=run_id)
    if run.status == RunStatus.QUEUED and run.cancel_requested_at is None:
        transition_run(run, "start", actor=ACTOR, reason="picked up by worker")
    while True:
        run.refresh_from_db()
        if run.status != RunStatus.RUNNING:
            return run
        if run.cancel_requested_at is not None:
            return cancel_run(run=run, actor=ACTOR, reason="cancelled at a safe point")
        if not _step(run):
            return run


def _step(run: Run) -> bool:
    """Do the one next thing for a running run; False when the run stopped running."""
    calls = list(run.tool_calls.order_by("id"))
    ready = [c for c in calls if c.status == S.READY]
    if ready:
        set_phase(run, Phase.EXECUTING_TOOLS)
        execute_tool_call(ready[0], actor=ACTOR)
        return True
    if any(c.status == S.AWAITING_APPROVAL for c in calls):
        return not _wait_for_approval(run)
    _deliver_tool_results(run, calls)
    return _model_turn(run)


def _wait_for_approval(run: Run) -> bool:
    """Put the run in ``waiting/approval`` unless a decision came in first; True if it waits."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if not locked.tool_calls.filter(status=S.AWAITING_APPROVAL).exists():
            return False
        transition_run(locked, "wait", actor=ACTOR, reason="a tool call needs approval",
                       waiting_reason=WaitingReason.APPROVAL)
    return True


def _deliver_tool_results(run: Run, calls: list[ToolCall]) -> None:
    """Append a tool message for every finished call that has none yet, in call order.

    Invalid, denied, rejected, expired and cancelled calls get one too, so
    the model never sees a call id without a result.
    """
    delivered = set(run.messages.filter(role="tool").values_list("tool_call_id", flat=True))
    with transaction.atomic():
        for call in calls:
            if not call.is_pending and call.provider_call_id not in delivered:
                append_message(run, role="tool", content=tool_result_content(call), tool_call_id=call.provider_call_id)


def _fail(run: Run, failure_type: str, error: str) -> bool:
    transition_run(run, "fail", actor=ACTOR, reason=error, failure_type=failure_type, error=error)
    return False


def _model_turn(run: Run) -> bool:
    """Call the model once and act on its answer; False when the run stopped running."""
    agent = run.agent
    if run.model_calls >= agent.max_turns:
        return _fail(run, FailureType.BUDGET_EXHAUSTED, f"Budget max_turns ({agent.max_turns}) exhausted.")
    set_phase(run, Phase.PREPARING_CONTEXT)
    request = ModelRequest(
        instructions=agent.instructions,
        messages=[_as_model_message(m) for m in Message.objects.filter(session_id=run.session_id)],
        tools=[tool.definition() for tool in tools_for_agent(agent)],
        turn_index=run.model_calls,
        run_id=run.pk,
    )
    step = Step.objects.create(run=run, index=run.steps.count(),
                               request={"turn_index": request.turn_index, "messages": len(request.messages)})
    set_phase(run, Phase.CALLING_MODEL)
    try:
        response = get_client(agent.model).complete(request)
    except (ModelError, ConfigError) as exc:
        Step.objects.filter(pk=step.pk).update(status=Step.Status.FAILED, error=str(exc), finished_at=timezone.now())
        with transaction.atomic():
            append_event(run, type="model_call", actor=ACTOR, reason="failed", payload={"step": step.pk, "error": str(exc)})
            return _fail(run, FailureType.MODEL_ERROR, str(exc))

    with transaction.atomic():
        Step.objects.filter(pk=step.pk).update(
            status=Step.Status.SUCCEEDED, response=response.as_dict(), finished_at=timezone.now(),
            input_tokens=response.input_tokens, output_tokens=response.output_tokens,
        )
        Run.objects.filter(pk=run.pk).update(
            model_calls=F("model_calls") + 1,
            input_tokens=F("input_tokens") + response.input_tokens,
            output_tokens=F("output_tokens") + response.output_tokens,
        )
        append_event(run, type="model_call", actor=ACTOR, reason=response.finish_reason,
                     payload={"step": step.pk, "tool_calls": len(response.tool_calls),
                              "input_tokens": response.input_tokens, "output_tokens": response.output_tokens})
        append_message(run, role="assistant", content=response.content, tool_calls=[
            {"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in response.tool_calls
        ])
        if response.tool_calls:
            created = propose_tool_calls(run=run, step=step, calls=response.tool_calls,
                                         truncated=response.finish_reason == "length", actor=ACTOR)
            if all(c.status == S.INVALID for c in created):
                return _repair_turn(run, "every tool call of the turn was invalid")
            return True
    if not response.content.strip():
        return _repair_turn(run, "the model returned neither text nor tool calls")
    return _finish(run, response.content)


def _repair_turn(run: Run, why: str) -> bool:
    """Count a turn of invalid output; fail the run once the repair budget is spent."""
    Run.objects.filter(pk=run.pk).update(repair_turns=F("repair_turns") + 1)
    run.refresh_from_db(fields=["repair_turns"])
    limit = settings.TOLLGATE["MAX_REPAIR_TURNS"]
    if run.repair_turns > limit:
        return _fail(run, FailureType.INVALID_MODEL_OUTPUT, f"Invalid model output after {limit} repair turns: {why}.")
    with transaction.atomic():
        append_event(run, type="repair", actor=ACTOR, reason=why, payload={"repair_turn": run.repair_turns})
        if "neither" in why:
            append_message(run, role="system", content="Your last reply was empty. Answer or call a tool.")
    return True


def _finish(run: Run, content: str) -> bool:
    """The model gave a final answer: the completion check decides what that means."""
    set_phase(run, Phase.FINALIZING)
    verdict = completion.evaluate(run)
    if verdict.complete:
        transition_run(run, "complete", actor=ACTOR, reason=verdict.reason or "completion check passed",
                       outcome=verdict.outcome, final_output=content)
        return False
    Run.objects.filter(pk=run.pk).update(incomplete_nudges=F("incomplete_nudges") + 1)
    run.refresh_from_db(fields=["incomplete_nudges"])
    limit = settings.TOLLGATE["MAX_INCOMPLETE_NUDGES"]
    if run.incomplete_nudges > limit:
        return _fail(run, FailureType.INCOMPLETE, f"Not complete after {limit} reminders: {verdict.reason}")
    with transaction.atomic():
        append_event(run, type="incomplete", actor=ACTOR, reason=verdict.reason,
                     payload={"nudge": run.incomplete_nudges})
        append_message(run, role="system", content=f"The task is not complete: {verdict.reason}")
    return True


def _as_model_message(message: Message) -> dict:
    out = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = message.tool_calls
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out
