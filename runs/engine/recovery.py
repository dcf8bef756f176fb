"""Crash recovery: what a worker does on taking over a run, and the sweeper.

Takeover (docs/design.md#recovery-and-the-sweeper): a model step left ``started`` is
discarded (the model is asked again; the discarded call still counts
against the budget); a tool call left ``running`` is sent again if its tool
is read-only or idempotent, otherwise it becomes ``unknown`` and goes to
reconciliation; stored tool results are reused, never recomputed; a
waiting run keeps waiting.

The sweeper finds what nobody is advancing: active runs whose lease
expired (their worker died), queued or running runs that lost their broker
message, waiting runs whose ``wake_at`` passed (ending their waits that
are due first: ``runs.engine.waits.end_due_waits``), queued runs whose
``start_at`` came, and approvals past their deadline. Each kind of due
work is read with one query, capped per pass (``SWEEP_BATCH``) and handled
several items per transaction (``ITEMS_PER_TRANSACTION``).
"""

import logging
import random
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone
from django_fsm import can_proceed

from approvals.notifications import run_expired_on_commit, warn_claimed_items_expiring
from approvals.services import (
    close_reconciliation_items,
    expire_locked_interrupt,
    overdue_interrupts,
    request_reconciliation,
)
from runs.awaiting import drive
from runs.engine.budgets import deadline_passed
from runs.engine.lifecycle import end_run, load_endings
from runs.lease import fenced
from runs.models import TERMINAL_STATUSES, Agent, FailureType, Run, RunStatus, Step
from runs.services import append_event
from runs.transitions import apply
from runs.tx import locked_many
from runs.wakeups import runs_with_pending_wakeups, wake_on_commit
from tools.models import ToolCall, ToolCallStatus
from tools.registry import get_tool
from tools.services import charged_attempts, reconcile_delay, reconcile_unknown_call, recover_orphaned_call
from tools.waits import end_due_waits, prefetch_due_waits

log = logging.getLogger(__name__)
# How much later than all other in-flight work of a dead worker a run's work
# must have started for the death to be blamed on it. A step that kills its
# worker may still run for some milliseconds after recording its start
# (more on a loaded machine), while its neighbours record theirs.
BLAME_MARGIN = timedelta(milliseconds=500)
# Due items the sweeper handles in one transaction: fewer commits and round
# trips per item, while the run locks it holds together stay few and short
# (a crash rolls back at most this many; the next pass does them again).
ITEMS_PER_TRANSACTION = 25


def recover_after_takeover(run: Run, *, actor: str, calls: list[ToolCall] | None = None) -> str | None:
    """Clean up what the run's previous lease holder left in flight (see module doc).

    ``calls``: the run's tool calls, if the caller has them loaded (the
    loop does); else the running ones are read.

    A takeover that finds work in flight means a worker died on it. When
    the sweeper broke the dead lease it already counted the death and
    decided whom to blame (``attribute_deaths``); otherwise the run is
    blamed here: ``lost_leases``, ``loss_streak`` and ``crash_streak`` grow
    by one (both streaks reset whenever a model call or a tool attempt gets
    through). Returns ``"crash_loop"`` once ``crash_streak`` reaches
    ``TOLLGATE["MAX_CRASHES_PER_STEP"]`` or ``loss_streak`` reaches
    ``TOLLGATE["MAX_LOSSES_PER_STEP"]``, or when a call in flight died on
    its last allowed attempt (``max_attempts``) in a run blamed for this death
    (the caller ends the run; a side-effecting call in flight is then handed
    to reconciliation), else None.
    """
    steps = list(run.steps.filter(status=Step.Status.STARTED))
    if calls is None:
        calls = run.tool_calls.filter(status=ToolCallStatus.RUNNING)
    calls = [call for call in calls if call.status == ToolCallStatus.RUNNING]
    if not steps and not calls:
        return None
    with transaction.atomic():
        counters = fenced(Run.objects.filter(pk=run.pk), run.pk)
        blamed = run.death_blame != "bystander"
        if run.death_blame:
            counters.update(death_blame="")
        else:
            counters.update(lost_leases=F("lost_leases") + 1, loss_streak=F("loss_streak") + 1,
                            crash_streak=F("crash_streak") + 1)
        run.refresh_from_db(fields=["lost_leases", "crash_streak", "loss_streak", "death_blame"])
        append_event(run, type="recovery", actor=actor, reason="took over from a worker that died",
                     payload={"lost_leases": run.lost_leases, "crash_streak": run.crash_streak,
                              "loss_streak": run.loss_streak, "blamed": blamed,
                              "steps": [step.pk for step in steps], "tool_calls": [call.pk for call in calls]})
    for step in steps:
        apply(step.discard, actor=actor, reason="discarded after a worker crash", now=timezone.now())
    limits = settings.TOLLGATE
    if run.crash_streak >= limits["MAX_CRASHES_PER_STEP"] or run.loss_streak >= limits["MAX_LOSSES_PER_STEP"]:
        return "crash_loop"
    # A call whose worker died on its last allowed attempt, in a run blamed for this death: the same.
    if blamed and any(charged_attempts(call) >= getattr(get_tool(call.name), "max_attempts", 1) for call in calls):
        return "crash_loop"  # the call stays running: ending the run hands it to reconciliation
    for call in calls:  # a bystander's sends cut off by a neighbour's crash do not use up its attempts
        recover_orphaned_call(call, actor=actor, spare_attempts=not blamed)
    return None


def reconcile_after_run_end(*, now, limit: int | None = None) -> int:
    """Ask the reconcile hooks about ``unknown`` calls of runs that have ended; returns how many were asked.

    Each call due (``reconcile_after <= now``; the longest due first, at
    most ``limit``, default ``SWEEP_BATCH``: the rest wait for the next
    pass) is claimed with one conditional UPDATE, so two sweepers never ask
    about it at once. A call the hook settles is done; one it cannot find
    yet is asked again after ``reconcile_delay``; after
    ``RECONCILE_MAX_TRIES`` a person's reconciliation item is opened.
    """
    limit = _limit(limit)
    due = ToolCall.objects.filter(status=ToolCallStatus.UNKNOWN, reconcile_after__lte=now,
                                  run__status__in=TERMINAL_STATUSES).order_by("reconcile_after", "id")
    asked = 0
    for call in due.select_related("run")[:limit]:
        claim_until = now + timedelta(seconds=settings.TOLLGATE["LEASE_TTL_S"])
        if not ToolCall.objects.filter(pk=call.pk, reconcile_after=call.reconcile_after).update(
                reconcile_after=claim_until):
            continue
        verdict = drive(reconcile_unknown_call(call, actor="sweeper"))
        asked += 1
        if verdict == "later":
            next_try = timezone.now() + timedelta(seconds=reconcile_delay(call))
            ToolCall.objects.filter(pk=call.pk).update(reconcile_after=next_try)
            continue
        ToolCall.objects.filter(pk=call.pk).update(reconcile_after=None)
        with transaction.atomic():
            if verdict == "person":
                request_reconciliation(tool_call=call)
            else:  # settled by the hook: a person's item for it has nothing left to decide
                close_reconciliation_items(tool_call=call, actor="sweeper", reason="settled automatically")
    return asked


def _limit(limit: int | None) -> int:
    """``limit``, or ``TOLLGATE["SWEEP_BATCH"]``: how many due items of one kind a pass handles."""
    return settings.TOLLGATE["SWEEP_BATCH"] if limit is None else limit


def _chunks(items: list, size: int = ITEMS_PER_TRANSACTION):
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def fail_waiting_runs_past_deadline(*, now, limit: int | None = None) -> int:
    """Fail waiting runs whose agent's ``deadline_s`` has passed (``deadline_exceeded``); returns how many.

    A waiting run reaches no safe point of the loop, so the sweeper keeps
    the deadline for it: a run may wait for a person, but not past its deadline.
    Asked per agent version that has a deadline (every version, not only the
    current one: a run keeps the deadline of the version it started with),
    so each query reads only the runs
    whose deadline passed (index ``run_waiting_started``), never every
    waiting run: one query per such version, whatever the number of runs; at
    most ``limit`` runs (default ``SWEEP_BATCH``), the rest next pass. They
    are failed ``ITEMS_PER_TRANSACTION`` at a time, each checked again
    under its row lock and ended by ``end_run`` as ``expire_overdue_approvals`` does.
    """
    limit, due = _limit(limit), []
    for agent_id, deadline_s in Agent.objects.filter(deadline_s__isnull=False).values_list("pk", "deadline_s"):
        if len(due) >= limit:
            break
        started_before = now - timedelta(seconds=deadline_s)
        past = Run.objects.filter(status=RunStatus.WAITING, agent_id=agent_id, started_at__lte=started_before)
        due += past.order_by("started_at").values_list("pk", flat=True)[:limit - len(due)]
    failed = 0
    for chunk in _chunks(due):
        with locked_many(chunk, related=("agent",)) as txs:
            runs = {run_id: tx.run for run_id, tx in txs.items()}
            reads = load_endings(list(runs.values()))
            for run in runs.values():
                passed = deadline_passed(run, now=now)
                if run.status != RunStatus.WAITING or passed is None:
                    continue
                failure_type, error = passed
                end_run(run.fail, actor="sweeper", reason=error, failure_type=failure_type, error=error,
                        reads=reads[run.pk])
                failed += 1
    return failed


def expire_overdue_approvals(*, now, limit: int | None = None) -> int:
    """Expire pending items past ``expires_at`` and fail their runs (``approval_expired``); returns how many expired.

    The longest overdue first, at most ``limit`` (default ``SWEEP_BATCH``);
    the rest are left to the next pass. ``ITEMS_PER_TRANSACTION`` items
    share a transaction, which first takes their runs' row locks (in id
    order; a person's decision takes the run's lock too), then loads what
    ending those runs needs with one query per kind of row
    (``load_endings``). Each item is then expired and its run ended exactly
    as if alone: the same events and transitions, in the same order. The
    requesters' emails go after commit (``approvals.notifications``).
    """
    count = 0
    for chunk in _chunks(overdue_interrupts(now=now, limit=_limit(limit))):
        with locked_many({run_id for _, run_id in chunk}) as txs:
            runs = {run_id: tx.run for run_id, tx in txs.items()}
            reads = load_endings(list(runs.values()))
            for interrupt_id, run_id in chunk:
                if run_id not in runs:
                    continue
                run, loaded = runs[run_id], reads[run_id]
                item = next((item for item in loaded.items if item.pk == interrupt_id), None)
                if item is None:  # decided or cancelled since it was found
                    continue
                item.run = run
                if item.tool_call_id is not None:
                    item.tool_call = next(call for call in loaded.calls if call.pk == item.tool_call_id)
                if expire_locked_interrupt(item, now=now, actor="sweeper") is None:
                    continue
                if not run.is_terminal:
                    end_run(run.fail, actor="sweeper", reason="approval expired",
                            failure_type=FailureType.APPROVAL_EXPIRED,
                            error=f"Inbox item {interrupt_id} expired before anyone decided.", reads=loaded)
                    run_expired_on_commit(interrupt_id)
                count += 1
    return count


def attribute_deaths(dead: list[tuple[int, str]]) -> dict[int, bool]:
    """Who is to blame for each worker death: ``{run id: blamed}`` for runs that died with work in flight.

    ``dead`` is ``(run id, lease owner)`` of runs whose lease expired. The
    runs one worker held died together; the one whose in-flight step or
    tool call started last is blamed (a step that kills its worker does so
    soon after it starts), the others are bystanders: their deaths count
    towards ``MAX_LOSSES_PER_STEP`` only. A run that died alone is blamed.
    When another run's work started less than ``BLAME_MARGIN`` before the
    last one, the order says nothing (the killing step may be the earlier
    one, still between its start and the kill): nobody is blamed.
    """
    by_owner: dict[str, list[int]] = {}
    for run_id, owner in dead:
        by_owner.setdefault(owner, []).append(run_id)
    blame: dict[int, bool] = {}
    for run_ids in by_owner.values():
        started = {}
        for model in (Step.objects.filter(status=Step.Status.STARTED),
                      ToolCall.objects.filter(status=ToolCallStatus.RUNNING)):
            for run_id, latest in model.filter(run_id__in=run_ids).values("run_id").annotate(
                    latest=Max("started_at")).values_list("run_id", "latest"):
                if latest is not None and (run_id not in started or latest > started[run_id]):
                    started[run_id] = latest
        starts = sorted(started.values(), reverse=True)
        clear = len(starts) < 2 or starts[0] - starts[1] >= BLAME_MARGIN  # none in flight: nothing to blame
        blame.update({run_id: clear and at == starts[0] for run_id, at in started.items()})
    return blame


def _restart_delay_ms(crash_streak: int) -> int:
    """Milliseconds to hold back a run whose worker died: full jitter on ``CRASH_BACKOFF_S * 2**streak``.

    The runs a dead worker held are found together; sent back together they
    would land on one worker again, so a step that kills its worker would
    keep taking the same neighbours down with it (and push their crash
    streaks towards ``crash_loop``). Spreading them out breaks that up.
    Source: "Exponential Backoff And Jitter", AWS Architecture Blog (2015).
    """
    return int(random.uniform(0, settings.TOLLGATE["CRASH_BACKOFF_S"] * 2 ** crash_streak) * 1000)


def start_scheduled_runs(*, now, limit: int | None = None) -> int:
    """Wake queued runs whose ``start_at`` (``wake_at``) has come; returns how many.

    Each is claimed with one conditional UPDATE (``wake_at`` and the
    ``scheduled`` reason cleared), so it is sent once whatever the number of
    sweepers; from then on it is an ordinary queued run. The earliest
    first, at most ``limit`` (default ``SWEEP_BATCH``), ``ITEMS_PER_TRANSACTION``
    per transaction.
    """
    due = list(Run.objects.filter(status=RunStatus.QUEUED, wake_at__lte=now).order_by("wake_at")
               .values_list("pk", "wake_at")[:_limit(limit)])
    started = 0
    for chunk in _chunks(due):
        with transaction.atomic():
            claimed = {run_id: wake_at for run_id, wake_at in sorted(chunk)  # rows locked in id order
                       if Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, wake_at=wake_at).update(
                           wake_at=None, waiting_reason="", updated_at=now)}
            for run in Run.objects.filter(pk__in=claimed).order_by("pk") if claimed else ():
                append_event(run, type="schedule", actor="sweeper", reason="start_at reached",
                             payload={"start_at": claimed[run.pk].isoformat()})
                wake_on_commit(run.pk)
        started += len(claimed)
    return started


def wake_due_runs(*, now, limit: int | None = None) -> int:
    """Wake waiting runs whose ``wake_at`` passed: their due waits end (``end_due_waits``), ``wake``, enqueued.

    Returns how many were woken. The earliest first, at most ``limit``
    (default ``SWEEP_BATCH``), ``ITEMS_PER_TRANSACTION`` per transaction: their
    row locks taken in id order, their due waits read with one query (``prefetch_due_waits``). A run
    that moved on or whose timer moved since it was found is left alone.
    """
    due = list(Run.objects.filter(status=RunStatus.WAITING, wake_at__lte=now).order_by("wake_at")
               .values_list("pk", flat=True)[:_limit(limit)])
    woken = 0
    for chunk in _chunks(due):
        with locked_many(chunk) as txs:
            prefetch_due_waits(txs, now=now)
            for tx in txs.values():
                run = tx.run
                if not can_proceed(run.wake) or run.wake_at > now:  # moved on, or its timer moved
                    continue
                end_due_waits(tx, now=now, actor="sweeper")
                tx.apply(run.wake, actor="sweeper", reason=f"wake_at passed ({run.waiting_reason})")
                tx.wake()
                woken += 1
    return woken


def sweep(*, now=None) -> dict:
    """One pass of the sweeper; returns counts ``{"reenqueued", "woken", "expired", "reconciled"}``.

    Safe to run from any number of processes at once: waking a worker is
    harmless (leases decide who advances) and transitions are guarded. It
    also warns the claimers of items about to expire (once per item). A
    pass is bounded: at most ``SWEEP_MAX_RESENDS`` re-sends and
    ``SWEEP_BATCH`` due items of each other kind; what is left over is the
    next pass's.
    """
    now = now or timezone.now()
    grace = now - timedelta(seconds=settings.TOLLGATE["QUEUED_GRACE_S"])
    stranded = list(Run.objects.filter(
        Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True, updated_at__lt=grace),
        status__in=[RunStatus.QUEUED, RunStatus.RUNNING],
    ).exclude(status=RunStatus.QUEUED, wake_at__gt=now)  # not lost: its start_at has not come
        .order_by("updated_at").values_list("pk", "lease_expires_at", "crash_streak", "lease_owner"))
    blame = attribute_deaths([(pk, owner) for pk, expired, _, owner in stranded if expired is not None])
    # A run with no lease whose wake-up the broker still holds is waiting its
    # turn, not lost: sending it again would only lengthen the queue.
    waiting_turn = runs_with_pending_wakeups() if any(expired is None for _, expired, _, _ in stranded) else set()
    reenqueued = 0
    for run_id, lease_expired_at, crash_streak, _ in stranded:
        if reenqueued >= settings.TOLLGATE["SWEEP_MAX_RESENDS"]:
            break
        if lease_expired_at is None and waiting_turn is not None and run_id in waiting_turn:
            continue
        with transaction.atomic():
            # Break the dead lease and restart the grace period, so the next
            # pass does not send the same run again while it sits in a
            # backlog. The fencing token still stops the old holder.
            death = {}
            if run_id in blame:  # it died with work in flight: count it here, blamed or not
                death = {"lost_leases": F("lost_leases") + 1, "loss_streak": F("loss_streak") + 1,
                         "crash_streak": F("crash_streak") + int(blame[run_id]),
                         "death_blame": "culprit" if blame[run_id] else "bystander"}
            if Run.objects.filter(pk=run_id).filter(
                Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
            ).update(lease_owner="", lease_expires_at=None, updated_at=now, **death):
                wake_on_commit(run_id, delay_ms=_restart_delay_ms(crash_streak) if lease_expired_at else None)
                reenqueued += 1

    woken = start_scheduled_runs(now=now) + wake_due_runs(now=now)
    expired = expire_overdue_approvals(now=now) + fail_waiting_runs_past_deadline(now=now)
    warn_claimed_items_expiring(now=now)
    reconciled = reconcile_after_run_end(now=now)
    if reenqueued or woken or expired or reconciled:
        log.info("sweep: reenqueued=%s woken=%s expired=%s reconciled=%s", reenqueued, woken, expired, reconciled)
    return {"reenqueued": reenqueued, "woken": woken, "expired": expired, "reconciled": reconciled}
