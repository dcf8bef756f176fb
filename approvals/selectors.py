"""Reads for the inbox pages (HackSoft-style selectors).

Who may decide or look at an item is ``Interrupt.objects.decidable_by`` /
``visible_to`` (``runs.access``); these functions only load what a page shows.
"""

from datetime import date, datetime, time, timedelta

from django.db.models import Count
from django.utils import timezone

from approvals.models import AnswerFile, Interrupt, InterruptStatus
from config.strict_json import StrictJSONError, loads
from runs.models import Run


def _with_relations(queryset):
    return queryset.select_related("run", "run__agent", "run__requested_by", "tool_call", "resolved_by",
                                   "claimed_by", "answer_file")


def assigned_to(queryset, user, assigned: str | None):
    """The inbox's "assigned to me" hook: ``assigned == "me"`` keeps the items ``user`` claimed; else all."""
    return queryset.filter(claimed_by=user) if assigned == "me" else queryset


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


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def decided_items(*, user, mine: bool = False, decision: str = "", tool: str = "", day_from: date | None = None,
                  day_to: date | None = None):
    """Resolved items ``user`` may look at, most recently decided first (a queryset, for a paginator).

    ``mine``: only those ``user`` decided. ``decision``: one ``Decision``
    value. ``tool``: the tool call's name. ``day_from`` / ``day_to``:
    resolved on or after / on or before these days (inclusive, in the
    current time zone). The ordering is served by the indexes on
    ``(status, -resolved_at, -id)`` and ``(resolved_by, -resolved_at, -id)``.
    """
    items = Interrupt.objects.visible_to(user).filter(status=InterruptStatus.RESOLVED)
    if mine:
        items = items.filter(resolved_by=user)
    if decision:
        items = items.filter(decision=decision)
    if tool:
        items = items.filter(tool_call__name=tool)
    if day_from:
        items = items.filter(resolved_at__gte=_day_start(day_from))
    if day_to:
        items = items.filter(resolved_at__lt=_day_start(day_to) + timedelta(days=1))
    return _with_relations(items).order_by("-resolved_at", "-id")


def changed_arguments(tool_call, approved) -> list[tuple[str, object, object]]:
    """``(field, proposed value, approved value)`` for each top-level argument an approver changed, by name.

    The proposal is the model's text (``tool_call.raw_arguments``, kept
    verbatim: ``arguments`` holds the edited ones once approved). Empty when
    nothing was edited (``approved`` is None) or the proposal is unreadable.
    A field added or removed shows None on the side that lacks it.
    """
    if approved is None or tool_call is None or not isinstance(approved, dict):
        return []
    try:
        proposed = loads(tool_call.raw_arguments)
    except StrictJSONError:
        return []
    if not isinstance(proposed, dict):
        return []
    return [(key, proposed.get(key), approved.get(key)) for key in sorted(proposed.keys() | approved.keys())
            if proposed.get(key) != approved.get(key) or (key in proposed) != (key in approved)]


def answer_file_visible(*, user, interrupt_id: int) -> AnswerFile | None:
    """The file item ``interrupt_id`` was answered with, if ``user`` may see its run (``Run.objects.visible_to``)."""
    return (AnswerFile.objects.filter(interrupt_id=interrupt_id, interrupt__run__in=Run.objects.visible_to(user))
            .first())
