"""Django admin for worker heartbeats: view-only, with whether each worker is stale."""

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from runs.admin.base import ReadOnlyAdminMixin
from runs.ops.models import WorkerHeartbeat


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Worker processes as they last reported; a stale one missed three beats (it died or hangs)."""

    list_display = ("worker_id", "host", "pid", "queues", "runs_in_flight", "abandoned_threads", "started_at",
                    "last_seen", "alive")
    search_fields = ("worker_id", "host")
    fields = ("worker_id", "host", "pid", "queues", "runs_in_flight", "abandoned_threads", "started_at", "last_seen",
              "alive")

    @admin.display(description=_("alive"), boolean=True)
    def alive(self, heartbeat: WorkerHeartbeat) -> bool:
        return not heartbeat.is_stale()
