"""Crash recovery: what a worker does on taking over a run, and whom a worker's death is blamed on.

Takeover (docs/design.md#recovery-and-the-sweeper): a model step left ``started`` is
discarded (the model is asked again; the discarded call still counts
against the budget); a tool call left ``running`` is sent again if its tool
is read-only or idempotent, otherwise it becomes ``unknown`` and goes to
reconciliation; stored results are reused, never recomputed; a waiting
run keeps waiting.

Blame (``attribute_deaths``, ``restart_delay_ms``) is what the sweeper's
``runs.engine.sweep_jobs.rescue_stranded`` asks when it breaks the leases
of a dead worker's runs.
"""

import random
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from runs.base import flight_recorder
from runs.lease import ACTIVE, fenced
from runs.models import DeathBlame, FailureType, Run, Step
from runs.services import append_event
from runs.transitions import apply
from tools.models import ToolCall, ToolCallStatus
from tools.registry import get_tool
from tools.services import charged_attempts, recover_orphaned_call

# How much later than all other in-flight work of a dead worker a run's work
# must have started for the death to be blamed on it. A step that kills its
# worker may still run for some milliseconds after recording its start
# (more on a loaded machine), while its neighbours record theirs.
BLAME_MARGIN = timedelta(milliseconds=500)


def recover_after_takeover(run: Run, *, actor: str, calls: list[ToolCall],
                           steps: list[Step] | None = None) -> FailureType | None:
    """Clean up what the run's previous lease holder left in flight (see module doc).

    ``calls``: the run's tool calls as the taking worker loaded them
    (``runs.engine.state.Known.calls``); the ``running`` ones are those in flight.
    ``steps``: the run's steps left ``started`` when the caller knows them (the
    loop reads whether any exist with the run's row), else None: they are read.

    A takeover that finds work in flight means a worker died on it. When
    the sweeper broke the dead lease it already counted the death and
    decided whom to blame (``attribute_deaths``); otherwise the run is
    blamed here: ``lost_leases``, ``loss_streak`` and ``crash_streak`` grow
    by one (both streaks reset whenever a model call or a tool attempt gets
    through). Returns ``FailureType.CRASH_LOOP`` once ``crash_streak`` reaches
    ``TOLLGATE["MAX_CRASHES_PER_STEP"]`` or ``loss_streak`` reaches
    ``TOLLGATE["MAX_LOSSES_PER_STEP"]``, or when a call in flight died on
    its last allowed attempt (``max_attempts``) in a run blamed for this death
    (the caller ends the run; a side-effecting call in flight is then handed
    to reconciliation), else None.
    """
    if steps is None:
        steps = list(run.steps.filter(status=Step.Status.STARTED))
    calls = [call for call in calls if call.status == ToolCallStatus.RUNNING]
    if not steps and not calls:
        if run.death_blame:  # a death the sweeper counted, yet its holder finished the step (a pause): counted
            Run.objects.filter(pk=run.pk).update(death_blame="")
            run.death_blame = ""
        return None
    with transaction.atomic():
        counters = fenced(Run.objects.filter(pk=run.pk), run.pk)
        verdict = run.death_blame or DeathBlame.CULPRIT
        blamed = verdict == DeathBlame.CULPRIT
        if run.death_blame:
            counters.update(death_blame="")
        else:
            counters.update(lost_leases=F("lost_leases") + 1, loss_streak=F("loss_streak") + 1,
                            crash_streak=F("crash_streak") + 1, suspect=True)
        run.refresh_from_db(fields=["lost_leases", "crash_streak", "loss_streak", "death_blame", "suspect"])
        append_event(run, type="recovery", actor=actor, reason="took over from a worker that died",
                     payload={"lost_leases": run.lost_leases, "crash_streak": run.crash_streak,
                              "loss_streak": run.loss_streak, "blamed": blamed, "verdict": str(verdict),
                              "steps": [step.pk for step in steps], "tool_calls": [call.pk for call in calls]})
    for step in steps:
        apply(step.discard, actor=actor, reason="discarded after a worker crash", now=timezone.now())
    limits = settings.TOLLGATE
    if run.crash_streak >= limits["MAX_CRASHES_PER_STEP"] or run.loss_streak >= limits["MAX_LOSSES_PER_STEP"]:
        return FailureType.CRASH_LOOP
    # A call whose worker died on its last allowed attempt, in a run blamed for this death: the same.
    if blamed and any(charged_attempts(call) >= getattr(get_tool(call.name), "max_attempts", 1) for call in calls):
        return FailureType.CRASH_LOOP  # the call stays running: ending the run hands it to reconciliation
    for call in calls:  # a bystander's sends cut off by a neighbour's crash do not use up its attempts
        recover_orphaned_call(call, actor=actor, spare_attempts=not blamed)
    return None


def attribute_deaths(dead: list[tuple[int, str]]) -> dict[str, dict[int, DeathBlame]]:
    """Who is to blame for each worker death: ``{lease owner: {run id: verdict}}`` for the runs that died
    with work in flight.

    ``dead`` is ``(run id, lease owner)`` of runs whose lease expired; the
    runs one worker held died together. When the dead worker's flight
    recorder is readable here (``runs.base.flight_recorder``: the sweeper
    shares its host, and the process is gone), every run still leased to
    it is judged with them, even one whose lease has not run out yet (a
    lease taken since the keeper's last renewal runs out up to a third of
    the TTL later, and the run that kills its worker is often one it has
    just taken): the run whose code its threads were running is the
    ``CULPRIT`` (of those in a call if any, else of those in the engine's
    own work); when several were, each is a ``SUSPECT`` (one of them did
    it, or none: a suspect with no crash counted). Runs in the engine's own
    work beside a call are ``BYSTANDER``s; the others were waiting for an
    answer (or the process was stopped: its box names nobody) and are
    ``CLEARED``. Otherwise (no box: another host, the process still runs)
    the one whose in-flight step or tool call started last is ``CULPRIT``
    (a step that kills its worker does so soon after it starts) and the
    others ``BYSTANDER``s. A run that died alone is blamed. When another
    run's work started less than ``BLAME_MARGIN`` before the last one, the
    order says nothing (the killing step may be the earlier one, still
    between its start and the kill): nobody is blamed.
    """
    by_owner: dict[str, set[int]] = {}
    for run_id, owner in dead:
        by_owner.setdefault(owner, set()).add(run_id)
    blame: dict[str, dict[int, DeathBlame]] = {}
    for owner, run_ids in by_owner.items():
        box = flight_recorder.read(owner)
        if box is not None:  # the process is gone: every run it held died with it
            run_ids |= set(Run.objects.filter(lease_owner=owner, status__in=ACTIVE).values_list("pk", flat=True))
        started = {}
        for model in (Step.objects.filter(status=Step.Status.STARTED),
                      ToolCall.objects.filter(status=ToolCallStatus.RUNNING)):
            for run_id, latest in model.filter(run_id__in=run_ids).values("run_id").annotate(
                    latest=Max("started_at")).values_list("run_id", "latest"):
                if latest is not None and (run_id not in started or latest > started[run_id]):
                    started[run_id] = latest
        if box is None:
            blame[owner] = _by_the_starts(started)
        else:
            blame[owner] = _by_the_box(started, {run_id: kind for run_id, kind in box.items() if run_id in started})
    return blame


def _by_the_box(started: dict, running: dict[int, int]) -> dict[int, DeathBlame]:
    """The verdicts on the runs ``started`` (run id: when its work in flight started) by what the dead
    worker's threads were running (``running``: run id: kind; none: every run is cleared)."""
    worst = max(running.values(), default=None)
    culprits = {run_id for run_id, kind in running.items() if kind == worst}
    verdict = DeathBlame.CULPRIT if len(culprits) == 1 else DeathBlame.SUSPECT
    return {run_id: verdict if run_id in culprits else DeathBlame.BYSTANDER if run_id in running
            else DeathBlame.CLEARED for run_id in started}


def _by_the_starts(started: dict) -> dict[int, DeathBlame]:
    """The verdicts on the runs ``started`` (run id: when its work in flight started) by the order of starts."""
    starts = sorted(started.values(), reverse=True)
    clear = len(starts) < 2 or starts[0] - starts[1] >= BLAME_MARGIN  # none in flight: nothing to blame
    return {run_id: DeathBlame.CULPRIT if clear and at == starts[0] else DeathBlame.BYSTANDER
            for run_id, at in started.items()}


def restart_delay_ms(crash_streak: int) -> int:
    """Milliseconds to hold back a run whose worker died: full jitter on ``CRASH_BACKOFF_S * 2**streak``,
    so a dead worker's runs do not land together again (docs/design.md#recovery-and-the-sweeper).
    Source: "Exponential Backoff And Jitter", AWS Architecture Blog (2015).
    """
    return int(random.uniform(0, settings.TOLLGATE["CRASH_BACKOFF_S"] * 2 ** crash_streak) * 1000)


