"""Settle a run's waits and resume the run that waited (docs/design.md#waits).

Writes shared by whoever ends a wait: a person answering a question
(``approvals.services.answer_interrupt``), an outside system's event
(``tools.waits.receive_event``), the sweeper at a wait's deadline
(``tools.waits.end_due_waits``), and ``end_run``. Callers hold the run's
row lock, the same lock the loop takes before it puts the run to wait, so
a wait is settled once.
"""

from django.utils import timezone

from runs.models import Run, RunStatus
from runs.services import append_event
from runs.transitions import apply
from runs.wakeups import wake_on_commit
from tools.models import Wait, WaitStatus
from tools.registry import ToolContext, ToolError


def settle_wait(wait: Wait, *, status: str, actor: str, result=None, error: str = "", resume: bool = True,
                now=None) -> bool:
    """Move a pending ``wait`` to ``status`` (done, timed_out, cancelled) with ``result`` or ``error``.

    Logs a ``wait`` event. With ``resume`` (default), a run still waiting
    for this kind of wait is resumed and a worker woken; the sweeper, which
    resumes the run itself, passes False. Returns False (nothing written)
    when the wait was no longer pending. Call inside a transaction holding
    the run's row lock.
    """
    now = now or timezone.now()
    if not Wait.objects.filter(pk=wait.pk, status=WaitStatus.PENDING).update(
            status=status, result=result, error=error, settled_at=now):
        return False
    wait.refresh_from_db()
    run = Run.objects.get(pk=wait.run_id)
    append_event(run, type="wait", actor=actor, reason=f"{wait.kind} wait {status}",
                 payload={"wait": wait.pk, "tool_call": wait.tool_call_id, "kind": wait.kind, "status": status,
                          **({"error": error} if error else {})})
    if resume and run.status == RunStatus.WAITING and run.waiting_reason == wait.kind:
        apply(run.resume, actor=actor, reason=f"{wait.kind} wait {status}")
        wake_on_commit(run.pk)
    return True


def cancel_waits(run: Run, *, actor: str, pending: list[Wait] | None = None) -> int:
    """Cancel every pending wait of ``run`` (it is ending); returns how many. An event key it held is free again.

    ``pending``: the run's pending waits, if the caller loaded them under the run's lock; else they are read.
    """
    if pending is None:
        pending = list(run.waits.filter(status=WaitStatus.PENDING))
    for wait in pending:
        settle_wait(wait, status=WaitStatus.CANCELLED, actor=actor, error="The run ended first.", resume=False)
    return len(pending)


def settled_result(ctx: ToolContext, arguments: dict):
    """The handler of a waiting tool (any kind): the settled wait's result, or ``ToolError`` with why there
    is none (still pending, timed out, refused, cancelled)."""
    wait = Wait.objects.filter(tool_call_id=getattr(ctx.tool_call, "pk", None)).first()
    if wait is None or wait.status == WaitStatus.PENDING:
        raise ToolError("Nothing has come yet for this wait.")
    if wait.status == WaitStatus.DONE:
        return wait.result
    raise ToolError(wait.error or f"The wait ended {wait.status}.")
