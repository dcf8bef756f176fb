"""Waits: open them for the loop, end them at their deadline, take in external events (docs/design.md#waits).

A ``ready`` call of a waiting tool (``Tool.wait``, e.g. ``tools.builtin``)
is not executed at once: ``open_wait`` stores a ``runs.models.Wait`` (and,
for a question, an inbox item of kind ``input``), and the loop puts the run
to wait with ``wake_at`` = the wait's deadline. Nothing holds a worker
meanwhile. The wait ends in one of three ways, each under the run's row
lock and each resuming the run:

* what it waited for came: an answer (``approvals.services.answer_interrupt``)
  or an event (``receive_event``);
* its deadline passed: the sweeper calls ``end_due_waits`` before it
  resumes the run (a scheduled wait is then done; a question or an event
  wait has timed out);
* the run ended (``runs.waits.cancel_waits``).

The resumed loop then executes the call: its handler turns the settled
wait into the call's result, or fails the call with the reason.
"""

import json
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.services import expire_input_item, request_input
from runs.access import may_deliver_event
from runs.base.errors import InvalidInput, NotFound
from runs.models import ExternalEvent, Run, Wait, WaitingReason, WaitStatus
from runs.services import actor_for, append_event
from runs.tx import RunTx, locked
from runs.waits import settle_wait
from tools.builtin import WAIT_FOR_EVENT, key_in_use
from tools.registry import Tool, ToolContext

TIMEOUT_ERRORS = {
    WaitingReason.INPUT: "No answer came before the question expired.",
    WaitingReason.EXTERNAL_EVENT: "Timed out: no {event_type} event came within the wait's timeout.",
}


def wait_of(tool_call) -> Wait | None:
    """The wait stored for ``tool_call``, or None."""
    return Wait.objects.filter(tool_call_id=tool_call.pk).first()


def open_wait(run: Run, tool_call, tool: Tool, *, actor: str) -> Wait:
    """Store the wait that ``tool_call`` (of waiting ``tool``) asks for; returns it, usually pending.

    Call inside the transaction that then puts the run to wait. A
    scheduled wait whose time has already come is ``done`` at once; an
    event wait whose type + key another wait holds (or an event already
    used) is ``refused``, and the call will fail saying so. A question
    also gets its inbox item here.
    """
    spec = tool.wait(ToolContext(run=run, user=run.requested_by, tool_call=tool_call), tool_call.arguments)
    wait = Wait(run=run, tool_call=tool_call, kind=spec.kind, deadline=spec.deadline, event_type=spec.event_type,
                correlation_key=spec.correlation_key)
    now = timezone.now()
    refused = (f"The key {spec.correlation_key!r} is already used for {spec.event_type} events."
               if spec.kind == WaitingReason.EXTERNAL_EVENT else "")
    if spec.kind == WaitingReason.SCHEDULED and spec.deadline <= now:
        wait.status, wait.result, wait.settled_at = WaitStatus.DONE, _woke(spec.deadline, now), now
    elif refused and key_in_use(spec.event_type, spec.correlation_key):
        wait.status, wait.error, wait.settled_at = WaitStatus.REFUSED, refused, now
    try:
        with transaction.atomic():
            wait.save()
    except IntegrityError:  # another wait took the key since the check
        wait.pk, wait.status, wait.error, wait.settled_at = None, WaitStatus.REFUSED, refused, now
        wait.save()
    if wait.status == WaitStatus.PENDING and spec.kind == WaitingReason.INPUT:
        request_input(tool_call=tool_call, title=spec.title, expires_at=spec.deadline)
    verb = "opened" if wait.status == WaitStatus.PENDING else wait.status
    append_event(run, type="wait", actor=actor, reason=f"{wait.kind} wait {verb}",
                 payload={"wait": wait.pk, "tool_call": tool_call.pk, "kind": wait.kind,
                          "deadline": wait.deadline.isoformat(), "status": wait.status,
                          **({"event_type": wait.event_type, "correlation_key": wait.correlation_key}
                             if wait.event_type else {})})
    return wait


def _woke(deadline, now) -> dict:
    return {"waited_until": deadline.isoformat(), "woke_at": now.isoformat()}


DUE = "engine.waits.due"  # RunTx.cache key: the run's pending waits past their deadline (prefetch_due_waits)


def prefetch_due_waits(txs: dict, *, now) -> None:
    """Load into each ``RunTx`` of ``txs`` (``{run id: RunTx}``, locked) its run's pending waits whose
    deadline passed by ``now``, with their calls, in id order: one query for all (``tx.cache[DUE]``)."""
    for tx in txs.values():
        tx.cache[DUE] = []
    for wait in Wait.objects.filter(run_id__in=txs, status=WaitStatus.PENDING, deadline__lte=now).select_related(
            "tool_call").order_by("id"):
        txs[wait.run_id].cache[DUE].append(wait)


def end_due_waits(tx: RunTx, *, now, actor: str) -> int:
    """End the pending waits of ``tx.run`` whose deadline passed by ``now``, as ``prefetch_due_waits``
    loaded them under the run's lock (``KeyError`` if it did not); returns how many.

    For the sweeper, which resumes the run afterwards. A scheduled wait is
    ``done``; a question's wait times out and its inbox item expires; an
    event wait times out. The call then fails with the reason
    (``TIMEOUT_ERRORS``) and the run goes on.
    """
    due = tx.cache[DUE]
    for wait in due:
        if wait.kind == WaitingReason.SCHEDULED:
            settle_wait(wait, status=WaitStatus.DONE, actor=actor, result=_woke(wait.deadline, now), resume=False,
                        now=now)
            continue
        if wait.kind == WaitingReason.INPUT:
            expire_input_item(tx, tool_call=wait.tool_call, now=now, actor=actor)
        error = TIMEOUT_ERRORS.get(wait.kind, "Timed out.").format(event_type=wait.event_type)
        settle_wait(wait, status=WaitStatus.TIMED_OUT, actor=actor, error=error, resume=False, now=now)
    return len(due)


@dataclass(frozen=True)
class Received:
    """What ``receive_event`` did: ``event`` stored now (``created``) or found from an earlier delivery."""

    event: ExternalEvent
    created: bool


def _check_event(event_type, key, payload) -> None:
    """Raise ``InvalidInput`` for a type, key or payload that breaks the limits (see ``receive_event``)."""
    # The patterns the wait's own arguments had to match.
    problems = WAIT_FOR_EVENT.schema_errors({"event_type": event_type, "correlation_key": key, "timeout_s": 1})
    errors = {}
    for problem in problems:
        field = "type" if problem.startswith("event_type") else "key"
        errors.setdefault(field, []).append(problem.split(": ", 1)[-1])
    size = len(json.dumps(payload, separators=(",", ":")).encode())
    limit = settings.TOLLGATE["MAX_EVENT_PAYLOAD_BYTES"]
    if size > limit:
        errors["payload"] = [f"The payload is {size} bytes of JSON; the limit is {limit}."]
    if errors:
        raise InvalidInput.for_fields(errors)


def receive_event(*, event_type: str, key: str, payload, user) -> Received:
    """An outside system reports event ``event_type`` with correlation ``key``: resume the run waiting on it.

    Only a pending wait with exactly this type and key is resumed, and
    only by a sender who may deliver to its run (``runs.access.may_deliver_event``:
    the run's requester, or a user with the ``runs.add_externalevent``
    permission, e.g. the token of the integrator's service that reports
    payments). A key can be guessed (the model may choose it), so it is
    not a capability of its own: to anyone else the wait, and an event
    delivered before, are not found. The event is stored (``ExternalEvent``), logged in
    the run's timeline, and its ``payload`` becomes the waiting call's
    result (``{"event_type", "correlation_key", "payload"}``). A repeat of
    a stored type + key changes nothing and returns the stored event
    (``created=False``). Raises ``InvalidInput`` (type or key not matching
    ``wait_for_event``'s patterns, payload over
    ``TOLLGATE["MAX_EVENT_PAYLOAD_BYTES"]``) and ``NotFound`` (no wait holds
    that type and key: unknown, timed out, or its run ended).
    """
    _check_event(event_type, key, payload)
    actor = actor_for(user)
    for _ in range(2):  # a concurrent first delivery of the same event may win the insert
        earlier = ExternalEvent.objects.select_related("run").filter(type=event_type, key=key).first()
        if earlier is not None and may_deliver_event(user, earlier.run):
            return Received(earlier, created=False)
        wait = Wait.objects.select_related("run").filter(kind=WaitingReason.EXTERNAL_EVENT, status=WaitStatus.PENDING,
                                                         event_type=event_type, correlation_key=key).first()
        if earlier is not None or wait is None or not may_deliver_event(user, wait.run):
            raise NotFound("No run is waiting for an event of this type with this key.")
        try:
            with locked(wait.run_id) as tx:
                run = tx.run
                event = ExternalEvent.objects.create(type=event_type, key=key, payload=payload, run=run, wait=wait,
                                                     received_by=user)
                append_event(run, type="external_event", actor=actor, reason=f"{event_type} received",
                             payload={"event": event.pk, "event_type": event_type, "wait": wait.pk,
                                      "tool_call": wait.tool_call_id})
                result = {"event_type": event_type, "correlation_key": key, "payload": payload}
                if not settle_wait(wait, status=WaitStatus.DONE, actor=actor, result=result):
                    raise NotFound("No run is waiting for an event of this type with this key.")
        except IntegrityError:
            continue
        return Received(event, created=True)
    return Received(ExternalEvent.objects.get(type=event_type, key=key), created=False)
