"""Read-only inlines of the run and session change pages: timeline, tool calls, inbox items, runs.

Each shows one page of rows at a time (``runs.admin_base.PagedInlineMixin``),
times with seconds in the request's time zone (``config.formats``), JSON
folded (``folded_json``), machine values as page words (``labelled``).
Rows with a page on the site get Django's "View on site" link.
"""

from django.contrib import admin
from django.utils.translation import gettext_lazy

from approvals.models import Interrupt
from runs.admin_base import PagedInlineMixin, ReadOnlyAdminMixin, folded_json, labelled, truncated
from runs.labels import label
from runs.models import Run, RunEvent
from tools.models import ToolCall


class RunEventInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The run's timeline in ``seq`` order, 50 events a page, with a link to the whole timeline on the site."""

    model = RunEvent
    fields = ("seq", "created_at", "type", "transition", "actor", "reason", "payload_view")
    ordering = ("seq",)
    extra = 0
    site_anchor = "timeline"
    verbose_name = gettext_lazy("timeline event")
    verbose_name_plural = gettext_lazy("Timeline")

    @admin.display(description=gettext_lazy("from → to"))
    def transition(self, event: RunEvent) -> str:
        if not (event.from_status or event.to_status):
            return ""
        return f"{label(event.from_status)} → {label(event.to_status)}"

    @admin.display(description=gettext_lazy("payload"))
    def payload_view(self, event: RunEvent) -> str:
        return folded_json(event.payload)


class ToolCallInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The run's tool calls in the order they were proposed, arguments folded."""

    model = ToolCall
    fields = ("id", "name", "status_label", "arguments_view", "side_effect", "attempts", "error", "created_at",
              "finished_at")
    ordering = ("id",)
    show_change_link = True
    extra = 0
    site_anchor = "tool-calls"

    status_label = labelled("status", gettext_lazy("status"))

    @admin.display(description=gettext_lazy("arguments"))
    def arguments_view(self, tool_call: ToolCall) -> str:
        return folded_json(tool_call.raw_arguments if tool_call.arguments is None else tool_call.arguments)


class InterruptInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The run's inbox items, oldest first: what was asked, what became of it, who decided and when."""

    model = Interrupt
    fields = ("kind_label", "title", "status_label", "decision_label", "resolved_by", "resolved_at", "comment",
              "created_at", "expires_at")
    ordering = ("created_at", "id")
    show_change_link = True
    extra = 0
    verbose_name = gettext_lazy("inbox item")
    verbose_name_plural = gettext_lazy("Inbox items")

    kind_label = labelled("kind", gettext_lazy("kind"))
    status_label = labelled("status", gettext_lazy("status"))
    decision_label = labelled("decision", gettext_lazy("decision"))

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("resolved_by")


class SessionRunInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The runs of a session, newest first, each linking to its run page."""

    model = Run
    fields = ("status_label", "phase_label", "waiting_reason_label", "outcome_label", "failure_type",
              "input_summary", "created_at")
    ordering = ("-created_at",)
    show_change_link = True
    extra = 0

    status_label = labelled("status", gettext_lazy("status"))
    phase_label = labelled("phase", gettext_lazy("phase"))
    waiting_reason_label = labelled("waiting_reason", gettext_lazy("waiting for"))
    outcome_label = labelled("outcome", gettext_lazy("outcome"))

    @admin.display(description=gettext_lazy("input"))
    def input_summary(self, run: Run) -> str:
        return truncated(run.input)
