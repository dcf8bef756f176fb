"""Worker heartbeats: which worker processes are alive, where, since when, and how busy (docs/operating.md)."""

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


def stale_after() -> timedelta:
    """How long after its last beat a worker counts as stale: three beats missed
    (``3 * TOLLGATE["WORKER_HEARTBEAT_S"]``)."""
    return timedelta(seconds=3 * settings.TOLLGATE["WORKER_HEARTBEAT_S"])


class WorkerHeartbeat(models.Model):
    """One Dramatiq worker process, as it last said (``runs.engine.heartbeat``): a row per process, rewritten
    every ``TOLLGATE["WORKER_HEARTBEAT_S"]`` seconds, deleted when the worker stops cleanly.

    ``worker_id`` is the process's lease owner (``runs.lease.WORKER_ID``,
    ``host:pid:random``), as in ``Run.lease_owner``. A row whose
    ``last_seen`` is older than ``stale_after()`` is a worker that died or
    hangs; it is deleted ``TOLLGATE["WORKER_PRUNE_AFTER_S"]`` seconds after
    its last beat.
    """

    worker_id = models.CharField(_("worker"), max_length=200, unique=True)
    host = models.CharField(_("host"), max_length=200)
    pid = models.PositiveIntegerField(_("process id"))
    queues = models.CharField(_("queues"), max_length=500, blank=True)
    started_at = models.DateTimeField(_("started at"))
    last_seen = models.DateTimeField(_("last seen"), db_index=True)
    runs_in_flight = models.PositiveIntegerField(_("runs in flight"), default=0)
    abandoned_threads = models.PositiveIntegerField(
        _("abandoned tool threads"), default=0,
        help_text=_("Sync tool handler threads still running a call that timed out (runs.base.awaiting)."))

    class Meta:
        verbose_name = _("worker heartbeat")
        verbose_name_plural = _("worker heartbeats")
        ordering = ["-last_seen"]

    def __str__(self):
        return self.worker_id

    def is_stale(self, now=None) -> bool:
        """Whether the worker missed three beats (``stale_after()``) by ``now`` (default: the current time)."""
        return (now or timezone.now()) - self.last_seen > stale_after()
