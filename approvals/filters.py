"""Query filters of the inbox API list (django-filter; invalid values are a 400, see ``config.filters``)."""

import django_filters as filters

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from config.filters import CreatedBetweenFilterSet, IdFilter


class InterruptFilter(CreatedBetweenFilterSet):
    """``/api/interrupts/``: ``status``, ``kind``, ``tool`` (the tool call's name), ``run`` (id),
    ``created_after`` / ``created_before``."""

    status = filters.ChoiceFilter(choices=InterruptStatus.choices)
    kind = filters.ChoiceFilter(choices=InterruptKind.choices)
    tool = filters.CharFilter(field_name="tool_call__name", max_length=100, help_text="A tool's name, e.g. refund.")
    run = IdFilter(field_name="run_id", help_text="Only items of this run.")

    class Meta:
        model = Interrupt
        fields = []
