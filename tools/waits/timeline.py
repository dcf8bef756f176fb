"""A wait's life: opened for the loop, ended at its deadline by the sweeper (docs/design.md#waits).

A ``ready`` call of a waiting tool (``Tool.wait``, e.g. ``tools.builtin``)
is not executed at once: ``open_wait`` stores a ``tools.models.Wait`` of the
kind the tool names (``tools.waits.kinds``), and the loop puts the run to
wait with ``wake_at`` = the wait's deadline. Nothing holds a worker
meanwhile. The wait ends in one of three ways, each under the run's row
lock: what it waited for came (the kind's own arrival, e.g. an answer or
``receive_event``, calls ``settle_wait``); its deadline passed
(``end_due_waits``, before the sweeper wakes the run); or the run ended
(``cancel_waits``). The resumed loop then executes the call: its handler
(``settled_result``) turns the settled wait into the call's result, or
fails the call with the reason.
"""

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs.models import Run
from runs.services import append_event
from runs.tx import RunTx
from tools.models import Wait, WaitStatus
from tools.registry import Tool, ToolContext
from tools.waits.kinds import get_wait_kind, kind_of
from tools.waits.settle import settle_wait


def wait_of(tool_call) -> Wait | None:
    """The wait stored for ``tool_call``, or None."""
    return Wait.objects.filter(tool_call_id=tool_call.pk).first()


def open_wait(run: Run, tool_call, tool: Tool, *, actor: str) -> Wait:
    """Store the wait that ``tool_call`` (of waiting ``tool``) asks for; returns it, usually pending.

    Call inside the transaction that then puts the run to wait. A wait its
    kind ends ``done`` at the deadline (a timer) whose time has already
    come is ``done`` at once; one its kind finds ``taken`` (an event type +
    key another wait holds) is ``refused``, and the call will fail saying
    so. A pending wait is then handed to its kind's ``open`` (a question's
    inbox item). Raises ``ImproperlyConfigured`` when the tool names a kind
    nobody registered.
    """
    spec = tool.wait(ToolContext(run=run, user=run.requested_by, tool_call=tool_call), tool_call.arguments)
    kind = get_wait_kind(spec.kind)
    wait = Wait(run=run, tool_call=tool_call, kind=kind.name, deadline=spec.deadline, event_type=spec.event_type,
                correlation_key=spec.correlation_key)
    now = timezone.now()
    if kind.done_at_deadline is not None and spec.deadline <= now:
        wait.status, wait.result, wait.settled_at = WaitStatus.DONE, kind.done_at_deadline(wait, now), now
    elif kind.taken is not None and kind.taken(wait):
        wait.status, wait.error, wait.settled_at = WaitStatus.REFUSED, kind.error(kind.taken_error, wait), now
    try:
        with transaction.atomic():
            wait.save()
    except IntegrityError:  # another wait took the key since the check
        wait.pk, wait.status, wait.settled_at = None, WaitStatus.REFUSED, now
        wait.error = kind.error(kind.taken_error, wait)
        wait.save()
    if wait.status == WaitStatus.PENDING and kind.open is not None:
        kind.open(wait, spec)
    verb = "opened" if wait.status == WaitStatus.PENDING else wait.status
    append_event(run, type="wait", actor=actor, reason=f"{wait.kind} wait {verb}",
                 payload={"wait": wait.pk, "tool_call": tool_call.pk, "kind": wait.kind,
                          "deadline": wait.deadline.isoformat(), "status": wait.status,
                          **({"event_type": wait.event_type, "correlation_key": wait.correlation_key}
                             if wait.event_type else {})})
    return wait


DUE = "tools.waits.due"  # RunTx.cache key: the run's pending waits past their deadline (prefetch_due_waits)


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

    For the sweeper, which resumes the run afterwards. A wait whose kind
    has ``done_at_deadline`` (a timer) is ``done``; any other times out,
    after its kind's ``on_timeout`` (a question's inbox item expires), and
    the call then fails with the kind's ``timeout_error``; the run goes on.
    """
    due = tx.cache[DUE]
    for wait in due:
        kind = kind_of(wait)
        if kind.done_at_deadline is not None:
            settle_wait(wait, status=WaitStatus.DONE, actor=actor, result=kind.done_at_deadline(wait, now),
                        resume=False, now=now)
            continue
        if kind.on_timeout is not None:
            kind.on_timeout(tx, wait, now=now, actor=actor)
        settle_wait(wait, status=WaitStatus.TIMED_OUT, actor=actor, error=kind.error(kind.timeout_error, wait),
                    resume=False, now=now)
    return len(due)
