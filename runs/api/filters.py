"""Query filters of the runs API lists (django-filter; invalid values are a 400, see ``config.filters``)."""

import django_filters as filters
from drf_spectacular.utils import extend_schema_field

from config.filters import CreatedBetweenFilterSet, IdFilter, SlugFilter
from runs.models import Run, RunStatus, Session, waiting_reason_choices


@extend_schema_field({"type": "string", "enum": ["me"]})
class MeFilter(filters.ChoiceFilter):
    """``me`` or nothing: a filter on the requesting user (its method decides how)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, choices=[("me", "me")], **kwargs)


class RunFilter(CreatedBetweenFilterSet):
    """``/api/runs/``: ``status``, ``agent`` (slug), ``session`` (id), ``waiting_reason``,
    ``created_after`` / ``created_before``, ``requested_by=me``."""

    status = filters.ChoiceFilter(choices=RunStatus.choices)
    agent = SlugFilter(field_name="agent__slug", help_text="The agent's slug.")
    session = IdFilter(field_name="session_id", help_text="A session's id.")
    # Called per request: a kind of wait a plug-in registered is a choice too.
    waiting_reason = filters.ChoiceFilter(choices=waiting_reason_choices)
    requested_by = MeFilter(method="filter_requested_by",
                                        help_text="me: only the runs you started (staff and approvers see all).")

    class Meta:
        model = Run
        fields = []

    def filter_requested_by(self, queryset, name, value):
        return queryset.filter(requested_by=self.request.user)


class SessionFilter(CreatedBetweenFilterSet):
    """``/api/sessions/``: ``agent`` (slug), ``created_after`` / ``created_before``."""

    agent = SlugFilter(field_name="agent__slug", help_text="The agent's slug.")

    class Meta:
        model = Session
        fields = []
