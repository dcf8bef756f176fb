"""The sweeper as an ordered list of jobs (docs/design.md#recovery-and-the-sweeper).

Each app registers its own sweep jobs from its ``AppConfig.ready`` with
``register_sweep_job`` (the engine's in ``runs.apps``, the inbox's expiry
warnings in ``approvals.apps``, the webhooks' backstop in
``runs.webhooks.apps``), so the kernel knows none of them. A pass
(``run_sweep``) runs every registered job in ``order``, lowest first.

A job is ``fn(*, now: datetime) -> dict[str, int]``: what it did, as counts
(``{"woken": 3}``), each count named once across all jobs. A job must be
safe to run from any number of processes at once and bounded per pass.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from django.utils import timezone

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepJob:
    """One registered job: its ``name``, ``fn(*, now) -> {count name: int}`` and its place ``order``."""

    name: str
    fn: Callable[..., dict[str, int]]
    order: int


@dataclass(frozen=True)
class JobResult:
    """What one job did in one pass: ``counts`` (empty when it ``failed``, i.e. raised)."""

    name: str
    counts: dict[str, int] = field(default_factory=dict)
    failed: bool = False


_JOBS: dict[str, SweepJob] = {}


def register_sweep_job(name: str, fn: Callable[..., dict[str, int]], *, order: int) -> SweepJob:
    """Add ``fn`` to every sweeper pass as job ``name``, run at ``order`` (lower first; ties by name); idempotent for the
    same ``fn``. Raises ``ImproperlyConfigured`` if another function holds ``name``.
    """
    known = _JOBS.get(name)
    if known is not None and known.fn is not fn:
        raise ImproperlyConfigured(f"A sweep job named {name!r} is already registered ({known.fn.__qualname__}).")
    _JOBS[name] = job = SweepJob(name=name, fn=fn, order=order)
    return job


def sweep_jobs() -> list[SweepJob]:
    """The registered jobs in the order a pass runs them."""
    return sorted(_JOBS.values(), key=lambda job: (job.order, job.name))


def run_sweep(*, now: datetime | None = None, keep_going: bool = False) -> list[JobResult]:
    """One sweeper pass: every job of ``sweep_jobs()`` at ``now`` (default: the time now); one result per job.

    A job that did something is logged at INFO with its counts. With
    ``keep_going`` (a long-lived sweeper process) a job that raises is
    logged and reported ``failed``, the next one still runs, and stale
    database connections are dropped after each job; without it the error
    propagates.
    """
    now = now or timezone.now()
    results = []
    for job in sweep_jobs():
        try:
            counts = dict(job.fn(now=now))
        except Exception:
            if not keep_going:
                raise
            log.exception("sweep job %s failed", job.name)  # database restarting, ...: the next pass tries again
            results.append(JobResult(job.name, failed=True))
            continue
        finally:
            if keep_going:
                close_old_connections()
        if any(counts.values()):
            log.info("sweep job %s: %s", job.name, " ".join(f"{key}={value}" for key, value in counts.items()))
        results.append(JobResult(job.name, counts))
    return results


def sweep(*, now: datetime | None = None) -> dict[str, int]:
    """One pass (``run_sweep``, errors raised), its counts merged: ``{count name: int}`` over all jobs."""
    return totals(run_sweep(now=now))


def totals(results: list[JobResult]) -> dict[str, int]:
    """The counts of ``results`` in one dict. Raises ``ImproperlyConfigured`` if two jobs name the same count."""
    merged: dict[str, int] = {}
    for result in results:
        taken = merged.keys() & result.counts.keys()
        if taken:
            raise ImproperlyConfigured(f"Sweep job {result.name} reports counts another job reports: {sorted(taken)}.")
        merged.update(result.counts)
    return merged
