"""Crash recovery: what a worker does on taking over a run, and the sweeper.

Takeover (DESIGN.md §5, recovery rules): a model step left ``started`` is
discarded (the model is asked again; the discarded call still counts
against the budget); a tool call left ``running`` is sent again if its tool
is read-only or idempotent, otherwise it becomes ``unknown`` and goes to
reconciliation; stored tool results are reused, never recomputed; a
waiting run keeps waiting.

The sweeper finds what nobody is advancing: active runs whose lease
expired (their worker died), queued or running runs that lost their broker
message, waiting runs whose ``wake_at`` passed, and approvals past their
deadline.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs.models import Run, RunStatus, Step
from runs.services import append_event, enqueue_advance, transition_run

log = logging.getLogger(__name__)


def recover_after_takeover(run: Run, *, actor: str) -> None:
    """Clean up what the run's previous lease holder left in flight (see module doc)."""
    from tools.models import ToolCallStatus
    from tools.services import recover_orphaned_call

    for step in run.steps.filter(status=Step.Status.STARTED):
        with transaction.atomic():
            append_event(run, type="model_call", actor=actor, reason="discarded after a worker crash",
                         payload={"step": step.pk})
            Step.objects.filter(pk=step.pk).update(status=Step.Status.DISCARDED, finished_at=timezone.now())
    for call in run.tool_calls.filter(status=ToolCallStatus.RUNNING):
        recover_orphaned_call(call, actor=actor)


def sweep(*, now=None) -> dict:
    """One pass of the sweeper; returns counts ``{"reenqueued", "woken", "expired"}``.

    Safe to run from any number of processes at once: waking a worker is
    harmless (leases decide who advances) and transitions are guarded.
    """
    from approvals.services import expire_overdue_interrupts

    now = now or timezone.now()
    grace = now - timedelta(seconds=settings.TOLLGATE["QUEUED_GRACE_S"])
    stranded = Run.objects.filter(
        Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True, updated_at__lt=grace),
        status__in=[RunStatus.QUEUED, RunStatus.RUNNING],
    ).values_list("pk", flat=True)
    reenqueued = 0
    for run_id in stranded:
        with transaction.atomic():
            # Break the dead lease and restart the grace period, so the next
            # pass does not send the same run again while it sits in a
            # backlog. The fencing token still stops the old holder.
            if Run.objects.filter(pk=run_id).filter(
                Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
            ).update(lease_owner="", lease_expires_at=None, updated_at=now):
                enqueue_advance(run_id)
                reenqueued += 1

    woken = 0
    for run in Run.objects.filter(status=RunStatus.WAITING, wake_at__lte=now):
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            if locked.status != RunStatus.WAITING or locked.wake_at is None or locked.wake_at > now:
                continue
            transition_run(locked, "resume", actor="sweeper", reason=f"wake_at passed ({locked.waiting_reason})")
            enqueue_advance(locked.pk)
        woken += 1

    expired = expire_overdue_interrupts(now=now)
    if reenqueued or woken or expired:
        log.info("sweep: reenqueued=%s woken=%s expired=%s", reenqueued, woken, expired)
    return {"reenqueued": reenqueued, "woken": woken, "expired": expired}
