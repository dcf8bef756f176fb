"""The engine's sweep jobs: what nobody is advancing (docs/design.md#recovery-and-the-sweeper).

Each is a job of ``runs.sweeping`` (``fn(*, now) -> {count: n}``), registered
by ``runs.apps`` in the order of ``JOBS``: active runs whose lease expired
(their worker died) or that lost their broker message, queued runs whose
``start_at`` came, waiting runs whose ``wake_at`` passed (ending their due
waits first: ``tools.waits.end_due_waits``), approvals past their
deadline, waiting runs past their agent's deadline, unknown calls of
ended runs, and the flight recorders of dead worker processes. Each kind
of due work is read with one query, capped per pass
(``SWEEP_BATCH``, ``SWEEP_MAX_RESENDS``) and handled several items per
transaction (``ITEMS_PER_TRANSACTION``). Any number of sweepers may run at
once: waking a worker is harmless (leases decide who advances), claims are
conditional UPDATEs and transitions are guarded.
"""

from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone
from django_fsm import can_proceed

from approvals.notifications import run_expired_on_commit
from approvals.services import (
    close_reconciliation_items,
    expire_locked_interrupt,
    overdue_interrupts,
    request_reconciliation,
)
from runs.base import flight_recorder, tracing
from runs.base.awaiting import drive
from runs.engine.budgets import deadline_passed
from runs.engine.lifecycle import end_run, load_endings
from runs.engine.recovery import attribute_deaths, restart_delay_ms
from runs.lease import ACTIVE
from runs.models import TERMINAL_STATUSES, Agent, DeathBlame, FailureType, Run, RunStatus, WaitingReason
from runs.services import append_event
from runs.tx import locked_many
from runs.wakeups import quarantine_queue, runs_with_pending_wakeups, wake_on_commit
from tools.models import ToolCall, ToolCallStatus
from tools.services import Reconciled, reconcile_delay, reconcile_unknown_call
from tools.waits import end_due_waits, prefetch_due_waits

# Due items the sweeper handles in one transaction: fewer commits and round
# trips per item, while the run locks it holds together stay few and short
# (a crash rolls back at most this many; the next pass does them again).
ITEMS_PER_TRANSACTION = 25


def _limit(limit: int | None) -> int:
    """``limit``, or ``TOLLGATE["SWEEP_BATCH"]``: how many due items of one kind a pass handles."""
    return settings.TOLLGATE["SWEEP_BATCH"] if limit is None else limit


def _chunks(items: list, size: int = ITEMS_PER_TRANSACTION):
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def rescue_stranded(*, now) -> dict[str, int]:
    """Send back queued or running runs nobody is advancing; returns ``{"reenqueued": n}``.

    A run whose lease expired (its worker died) goes back after
    ``restart_delay_ms``, its lease broken; its death is counted here first
    (``count_deaths``). So does a run whose lease has not run out yet but
    whose holder is known dead: a worker process of this host that left a
    flight recorder and is gone (``flight_recorder.dead_owners``), so its
    runs go on within a sweep interval, not a lease TTL, of a SIGKILL (the
    fencing token stops the holder anyway). A run with no lease and no update for
    ``QUEUED_GRACE_S`` whose wake-up the broker no longer holds is sent
    again. At most ``SWEEP_MAX_RESENDS`` per pass, the longest untouched
    first; deaths are counted for all, so that the runs one worker held are
    judged together, whichever pass sends them. With a quarantine queue
    (``TOLLGATE["QUARANTINE_QUEUE"]``), a suspect is sent there, not behind
    the regular queue's backlog to be sent on from it.
    """
    grace = now - timedelta(seconds=settings.TOLLGATE["QUEUED_GRACE_S"])
    lost = Q(lease_expires_at__lt=now)
    gone = flight_recorder.dead_owners()
    if gone:
        lost |= Q(lease_owner__in=gone, lease_expires_at__isnull=False)
    stranded = list(Run.objects.filter(
        lost | Q(lease_expires_at__isnull=True, updated_at__lt=grace),
        status__in=[RunStatus.QUEUED, RunStatus.RUNNING],
    ).exclude(status=RunStatus.QUEUED, wake_at__gt=now)  # not lost: its start_at has not come
        .order_by("updated_at").values_list("pk", "lease_expires_at", "crash_streak", "suspect", "lease_owner"))
    died = [(pk, owner) for pk, expired, *_, owner in stranded if expired is not None]
    count_deaths(died)
    if died:  # as the deaths just counted left them: a culprit's next try waits the longer, a suspect's is its own
        counted = {pk: rest for pk, *rest in Run.objects.filter(pk__in=[pk for pk, _ in died]).values_list(
            "pk", "crash_streak", "suspect")}
        stranded = [(pk, expired, *counted.get(pk, (streak, suspect)), owner)
                    for pk, expired, streak, suspect, owner in stranded]
    # A run with no lease whose wake-up the broker still holds is waiting its
    # turn, not lost: sending it again would only lengthen the queue.
    waiting_turn = runs_with_pending_wakeups() if any(expired is None for _, expired, *_ in stranded) else set()
    separate = bool(quarantine_queue())  # suspects go straight to their own queue, past the regular backlog
    reenqueued = 0
    for run_id, lease_expired_at, crash_streak, suspect, _ in stranded:
        if reenqueued >= settings.TOLLGATE["SWEEP_MAX_RESENDS"]:
            break
        if lease_expired_at is None and waiting_turn is not None and run_id in waiting_turn:
            continue
        with transaction.atomic():
            # Break the dead lease and restart the grace period, so the next
            # pass does not send the same run again while it sits in a
            # backlog. The fencing token still stops the old holder.
            if Run.objects.filter(lost | Q(lease_expires_at__isnull=True), pk=run_id).update(
                    lease_owner="", lease_expires_at=None, updated_at=now):
                wake_on_commit(run_id, delay_ms=restart_delay_ms(crash_streak) if lease_expired_at else None,
                               suspect=separate and suspect)
                reenqueued += 1
    return {"reenqueued": reenqueued}


def count_deaths(dead: list[tuple[int, str]]) -> None:
    """Count the deaths of the runs ``dead`` (``(run id, lease owner)`` of runs whose lease expired, judged
    together with the rest of their worker's, whether counted already or not: ``attribute_deaths``): for
    each not counted yet, its verdict in ``death_blame``, ``lost_leases`` and ``loss_streak`` one more,
    ``crash_streak`` one more for a culprit, and ``suspect`` set for a culprit or a suspect, for a
    bystander ``ISOLATE_AFTER_LOSSES`` losses in a row, and for a cleared run twice as many (a culprit the
    flight recorder missed). One UPDATE per worker and verdict, of rows still leased to that worker whose
    death is still uncounted (another sweeper may be first; a run taken over since is another's).
    """
    limit = settings.TOLLGATE["ISOLATE_AFTER_LOSSES"]
    losses_to_suspect = {DeathBlame.BYSTANDER: limit, DeathBlame.CLEARED: 2 * limit}
    for owner, verdicts in attribute_deaths(dead).items():
        by_verdict: dict[DeathBlame, list[int]] = {}
        for run_id, verdict in verdicts.items():
            by_verdict.setdefault(verdict, []).append(run_id)
        for verdict, run_ids in by_verdict.items():
            losses = losses_to_suspect.get(verdict)
            suspect = Value(True) if losses is None else Case(  # this death included
                When(loss_streak__gte=losses - 1, then=Value(True)), default=F("suspect"))
            Run.objects.filter(pk__in=run_ids, lease_owner=owner, death_blame="").update(
                lost_leases=F("lost_leases") + 1, loss_streak=F("loss_streak") + 1,
                crash_streak=F("crash_streak") + int(verdict == DeathBlame.CULPRIT), death_blame=verdict,
                suspect=suspect)


def start_scheduled_runs(*, now, limit: int | None = None) -> dict[str, int]:
    """Wake queued runs whose ``start_at`` (``wake_at``) has come; returns ``{"started": n}``.

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
                transaction.on_commit(partial(tracing.record_wait, run, WaitingReason.SCHEDULED,
                                              since=run.created_at, until=now, then=RunStatus.QUEUED))
                wake_on_commit(run.pk)
        started += len(claimed)
    return {"started": started}


def wake_due_runs(*, now, limit: int | None = None) -> dict[str, int]:
    """Wake waiting runs whose ``wake_at`` passed: their due waits end (``end_due_waits``), ``wake``, enqueued.

    Returns ``{"woken": n}``. The earliest first, at most ``limit``
    (default ``SWEEP_BATCH``), ``ITEMS_PER_TRANSACTION`` per transaction: their
    row locks taken in id order, a row another transaction holds skipped (taken at a later pass: a
    worker's group commit holds several runs' rows, taken in no order, ``runs.tx``), their due waits read
    with one query (``prefetch_due_waits``). A run that moved on or whose timer moved since it was found
    is left alone.
    """
    due = list(Run.objects.filter(status=RunStatus.WAITING, wake_at__lte=now).order_by("wake_at")
               .values_list("pk", flat=True)[:_limit(limit)])
    woken = 0
    for chunk in _chunks(due):
        with locked_many(chunk, skip_locked=True) as txs:
            prefetch_due_waits(txs, now=now)
            for tx in txs.values():
                run = tx.run
                if not can_proceed(run.wake) or run.wake_at > now:  # moved on, or its timer moved
                    continue
                end_due_waits(tx, now=now, actor="sweeper")
                tx.apply(run.wake, actor="sweeper", reason=f"wake_at passed ({run.waiting_reason})")
                tx.wake()
                woken += 1
    return {"woken": woken}


def fail_waiting_runs_past_deadline(*, now, limit: int | None = None) -> dict[str, int]:
    """Fail waiting runs whose agent's ``deadline_s`` has passed (``deadline_exceeded``): ``{"past_deadline": n}``.

    A waiting run reaches no safe point of the loop, so the sweeper keeps
    the deadline for it: a run may wait for a person, but not past its deadline.
    Asked per agent version that has a deadline (every version, not only the
    current one: a run keeps the deadline of the version it started with),
    so each query reads only the runs
    whose deadline passed (index ``run_waiting_started``), never every
    waiting run: one query per such version, whatever the number of runs; at
    most ``limit`` runs (default ``SWEEP_BATCH``), the rest next pass. They
    are failed ``ITEMS_PER_TRANSACTION`` at a time, each checked again
    under its row lock (a busy row skipped) and ended by ``end_run`` as
    ``expire_overdue_approvals`` does.
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
        with locked_many(chunk, related=("agent",), skip_locked=True) as txs:
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
    return {"past_deadline": failed}


def expire_overdue_approvals(*, now, limit: int | None = None) -> dict[str, int]:
    """Expire pending items past ``expires_at`` and fail their runs (``approval_expired``); returns ``{"expired": n}``.

    The longest overdue first, at most ``limit`` (default ``SWEEP_BATCH``);
    the rest are left to the next pass. ``ITEMS_PER_TRANSACTION`` items
    share a transaction, which first takes their runs' row locks (in id
    order, a busy row skipped; a person's decision takes the run's lock too), then loads what
    ending those runs needs with one query per kind of row
    (``load_endings``). Each item is then expired and its run ended exactly
    as if alone: the same events and transitions, in the same order. The
    requesters' emails go after commit (``approvals.notifications``).
    """
    count = 0
    for chunk in _chunks(overdue_interrupts(now=now, limit=_limit(limit))):
        with locked_many({run_id for _, run_id in chunk}, skip_locked=True) as txs:
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
    return {"expired": count}


def reconcile_after_run_end(*, now, limit: int | None = None) -> dict[str, int]:
    """Ask the reconcile hooks about ``unknown`` calls of runs that have ended; returns ``{"reconciled": asked}``.

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
        if verdict == Reconciled.LATER:
            next_try = timezone.now() + timedelta(seconds=reconcile_delay(call))
            ToolCall.objects.filter(pk=call.pk).update(reconcile_after=next_try)
            continue
        ToolCall.objects.filter(pk=call.pk).update(reconcile_after=None)
        with transaction.atomic():
            if verdict == Reconciled.PERSON:
                request_reconciliation(tool_call=call)
            else:  # settled by the hook: a person's item for it has nothing left to decide
                close_reconciliation_items(tool_call=call, actor="sweeper", reason="settled automatically")
    return {"reconciled": asked}


def discard_dead_flight_recorders(*, now) -> dict[str, int]:
    """Remove the flight recorders (``runs.base.flight_recorder``) of this host's worker processes that died,
    once none of their runs is still leased to them (``rescue_stranded`` has read them); returns
    ``{"discarded": n}``."""
    discarded = 0
    for owner in flight_recorder.dead_owners():
        if not Run.objects.filter(lease_owner=owner, status__in=ACTIVE).exists():
            flight_recorder.discard(owner)
            discarded += 1
    return {"discarded": discarded}


# The engine's jobs in the order a pass runs them: ``(order, job)``, registered
# under the job's name by ``runs.apps``. Other apps' jobs fit between
# (``approvals``: expiry warnings at 550) or after (``runs.webhooks``: 900).
JOBS = (
    (100, rescue_stranded),
    (200, start_scheduled_runs),
    (300, wake_due_runs),
    (400, expire_overdue_approvals),
    (500, fail_waiting_runs_past_deadline),
    (600, reconcile_after_run_end),
    (700, discard_dead_flight_recorders),
)
