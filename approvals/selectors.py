"""Reads for the inbox pages (HackSoft-style selectors).

Who may decide or look at an item is ``Interrupt.objects.decidable_by`` /
``visible_to`` (``runs.access``); these functions only load what a page shows.
"""

from django.db.models import Count

from approvals.models import AnswerFile, Interrupt, InterruptStatus
from runs.models import Run


def _with_relations(queryset):
    return queryset.select_related("run", "run__agent", "run__requested_by", "tool_call", "resolved_by",
                                   "answer_file")


def inbox_items(*, user):
    """Pending items ``user`` may decide, newest first, in one query whatever their number.

    Each has ``same_action_calls``: how many later calls re-proposed its tool call's action.
    """
    return (_with_relations(Interrupt.objects.decidable_by(user).filter(status=InterruptStatus.PENDING))
            .annotate(same_action_calls=Count("tool_call__duplicates")).order_by("-created_at", "-id"))


def interrupt_get_visible(*, user, interrupt_id: int) -> Interrupt | None:
    """Item ``interrupt_id`` if ``user`` may look at it (else None), with ``user_may_decide`` set."""
    return (_with_relations(Interrupt.objects.visible_to(user).with_decidable_flag(user))
            .filter(pk=interrupt_id).first())


def run_pending_interrupts(*, run) -> list[Interrupt]:
    """The run's pending inbox items, oldest first."""
    return list(_with_relations(run.interrupts.filter(status=InterruptStatus.PENDING)).order_by("created_at", "id"))


def answer_file_visible(*, user, interrupt_id: int) -> AnswerFile | None:
    """The file item ``interrupt_id`` was answered with, if ``user`` may see its run (``Run.objects.visible_to``)."""
    return (AnswerFile.objects.filter(interrupt_id=interrupt_id, interrupt__run__in=Run.objects.visible_to(user))
            .first())
