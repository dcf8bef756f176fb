"""Read-only inlines of the run and session change pages: tool calls, inbox items, timeline, runs.

Each shows one page of rows at a time (``runs.admin.base.PagedInlineMixin``),
times with seconds in the request's time zone (``config.formats``), JSON
folded (``folded_json``), headings and machine values in the page's
language (``column``). Rows with a page on the site get Django's "View on
site" link; tool calls and inbox items link to their own admin pages.
"""

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from approvals.models import Interrupt
from runs.admin.base import PagedInlineMixin, ReadOnlyAdminMixin, column, folded_json, truncated
from runs.base.labels import label
from runs.models import Run, RunEvent
from tools.models import ToolCall


class RunEventInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The run's timeline in ``seq`` order, 50 events a page, with a link to the whole timeline on the site."""

    model = RunEvent
    fields = ("seq_", "created_at_", "type_", "transition", "actor_", "reason_", "payload_view")
    ordering = ("seq",)
    extra = 0
    site_anchor = "timeline"
    classes = ["timeline"]
    verbose_name = _("timeline event")
    verbose_name_plural = _("Timeline")

    seq_ = column("seq", _("Seq"))
    created_at_ = column("created_at", _("Time"))
    type_ = column("type", _("Type"))
    actor_ = column("actor", _("Actor"))
    reason_ = column("reason", _("Reason"))

    @admin.display(description=_("From → to"))
    def transition(self, event: RunEvent) -> str:
        if not (event.from_status or event.to_status):
            return ""
        return f"{label(event.from_status)} → {label(event.to_status)}"

    @admin.display(description=_("Payload"))
    def payload_view(self, event: RunEvent) -> str:
        return folded_json(event.payload)


class ToolCallInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The run's tool calls in the order they were proposed, arguments folded."""

    model = ToolCall
    fields = ("name_", "status_", "arguments_view", "side_effect_", "attempts_", "error_", "created_at_",
              "finished_at_")
    ordering = ("id",)
    show_change_link = True
    extra = 0
    site_anchor = "tool-calls"
    verbose_name = _("tool call")
    verbose_name_plural = _("Tool calls")

    name_ = column("name", _("Tool"))
    status_ = column("status", _("Status"), as_word=True)
    side_effect_ = column("side_effect", _("Side effect"))
    attempts_ = column("attempts", _("Attempts"))
    error_ = column("error", _("Error"))
    created_at_ = column("created_at", _("Created"))
    finished_at_ = column("finished_at", _("Finished"))

    @admin.display(description=_("Arguments"))
    def arguments_view(self, tool_call: ToolCall) -> str:
        return folded_json(tool_call.raw_arguments if tool_call.arguments is None else tool_call.arguments)


class InterruptInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The run's inbox items, oldest first: what was asked, what became of it, who decided and when."""

    model = Interrupt
    fields = ("kind_", "title_", "status_", "decision_", "resolved_by_", "resolved_at_", "comment_", "created_at_",
              "expires_at_")
    ordering = ("created_at", "id")
    show_change_link = True
    extra = 0
    verbose_name = _("inbox item")
    verbose_name_plural = _("Inbox items")

    kind_ = column("kind", _("Kind"), as_word=True)
    status_ = column("status", _("Status"), as_word=True)
    decision_ = column("decision", _("Decision"), as_word=True)
    resolved_by_ = column("resolved_by", _("Decided by"))
    resolved_at_ = column("resolved_at", _("Decided at"))
    comment_ = column("comment", _("Comment"))
    created_at_ = column("created_at", _("Created"))
    expires_at_ = column("expires_at", _("Expires"))

    @admin.display(description=_("Title"))
    def title_(self, interrupt: Interrupt) -> str:
        """The item's title in the admin's language, from its call (``Interrupt.display_title``)."""
        return interrupt.display_title

    def get_queryset(self, request):
        """The items with who decided them and their calls (for the titles), in one query."""
        return super().get_queryset(request).select_related("resolved_by", "tool_call")


class SessionRunInline(PagedInlineMixin, ReadOnlyAdminMixin, admin.TabularInline):
    """The runs of a session, newest first, each linking to its run page."""

    model = Run
    fields = ("status_", "phase_", "waiting_reason_", "outcome_", "failure_type_", "input_summary", "created_at_")
    ordering = ("-created_at",)
    show_change_link = True
    extra = 0
    verbose_name = _("run")
    verbose_name_plural = _("Runs")

    status_ = column("status", _("Status"), as_word=True)
    phase_ = column("phase", _("Phase"), as_word=True)
    waiting_reason_ = column("waiting_reason", _("Waiting for"), as_word=True)
    outcome_ = column("outcome", _("Outcome"), as_word=True)
    failure_type_ = column("failure_type", _("Failure"), as_word=True)
    created_at_ = column("created_at", _("Created"))

    @admin.display(description=_("Input"))
    def input_summary(self, run: Run) -> str:
        return truncated(run.input)
