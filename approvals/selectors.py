"""Reads for the inbox pages (HackSoft-style selectors)."""

from django.db.models import Count

from approvals.models import Interrupt, InterruptStatus
from approvals.services import can_decide
from runs.selectors import run_is_visible


def _with_relations(queryset):
    return queryset.select_related("run", "run__agent", "run__requested_by", "tool_call", "resolved_by")


def inbox_items(*, user) -> list[Interrupt]:
    """Pending items ``user`` may act on (``approvals.services.can_decide``), newest first.

    Each has ``same_action_calls``: how many later calls re-proposed its tool call's action.
    """
    pending = (_with_relations(Interrupt.objects.filter(status=InterruptStatus.PENDING))
               .annotate(same_action_calls=Count("tool_call__duplicates")).order_by("-created_at", "-id"))
    return [item for item in pending if can_decide(user, item)]


def interrupt_get_visible(*, user, interrupt_id: int) -> Interrupt | None:
    """Item ``interrupt_id`` if ``user`` may decide it or may see its run; else None."""
    item = _with_relations(Interrupt.objects.filter(pk=interrupt_id)).first()
    if item is None:
        return None
    if can_decide(user, item) or run_is_visible(user=user, run=item.run):
        return item
    return None


def run_pending_interrupts(*, run) -> list[Interrupt]:
    """The run's pending inbox items, oldest first."""
    return list(_with_relations(run.interrupts.filter(status=InterruptStatus.PENDING)).order_by("created_at", "id"))
