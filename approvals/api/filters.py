"""Query filters of the inbox API list (django-filter; invalid values are a 400, see ``config.filters``)."""

import django_filters as filters

from approvals.selectors import assigned_to
from approvals.models import Interrupt, InterruptKind, InterruptStatus
from config.filters import CreatedBetweenFilterSet, IdFilter


class InterruptFilter(CreatedBetweenFilterSet):
    """``/api/interrupts/``: ``status``, ``kind``, ``tool`` (the tool call's name), ``run`` (id),
    ``created_after`` / ``created_before``, ``assigned=me``."""

    status = filters.ChoiceFilter(choices=InterruptStatus.choices)
    kind = filters.ChoiceFilter(choices=InterruptKind.choices)
    tool = filters.CharFilter(field_name="tool_call__name", max_length=100, help_text="A tool's name, e.g. refund.")
    run = IdFilter(field_name="run_id", help_text="Only items of this run.")
    assigned = filters.ChoiceFilter(choices=[("me", "me")], method="filter_assigned",
                                    help_text="`me`: only the items you claimed.")

    def filter_assigned(self, queryset, name, value):
        """``assigned=me``: the items the requesting user claimed (``approvals.selectors.assigned_to``)."""
        return assigned_to(queryset, self.request.user, value)

    class Meta:
        model = Interrupt
        fields = []
