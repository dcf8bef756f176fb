"""Django admin for agents, sessions, runs and their audit trail (docs/design.md#surfaces).

The admin reads everything and writes through services only:

* ``Agent``: saving the add form or the current version's change form goes
  through ``create_agent`` / ``update_agent``, so a change is a new version
  (the page then shows it); older versions and archived agents are
  view-only, nothing is deleted, the "Archive selected agents" action
  calls ``archive_agent``. A version that loosened tools' approval says so
  in a warning when saved and when opened, and in the list.
* ``Run`` is view-only; the only change an admin can make is the
  "Cancel selected runs" action, which calls ``runs.engine.lifecycle.cancel_run_as``
  (who may cancel: ``Run.objects.cancellable_by``).
  Its change page shows the tool calls, the inbox items and the timeline
  (``RunEvent``) inline, a page of rows at a time (``runs.admin.inlines``).
* ``Step``, ``Message`` and ``RunEvent`` are append-only records written by
  the runtime: no add, no change, no delete.

Filters by agent are by slug (``AgentSlugFilter``): they match every
version of it. Runs, sessions and inbox items link to their pages on the
site ("View on site", their ``get_absolute_url``). Times show seconds, in the time zone the
browser reported (``config.formats``, ``config.middleware``). The shared
pieces are in ``runs.admin.base``, the agent form in ``runs.admin.forms``.
"""

from django.contrib import admin, messages
from django.contrib.admin import DateFieldListFilter
from django.utils.translation import gettext as _, gettext_lazy, ngettext
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from config.error_display import admin_error
from runs.admin.base import (
    AgentSlugFilter,
    ReadOnlyAdminMixin,
    WaitingReasonFilter,
    all_fields,
    column,
    truncated,
    with_remaining_fields,
)
from runs.admin.forms import AgentAdminForm
from runs.admin.inlines import InterruptInline, RunEventInline, SessionRunInline, ToolCallInline
from runs.engine.agents import DEFINITION_FIELDS, archive_agent, create_agent, update_agent
from runs.engine.lifecycle import cancel_run_as
from runs.base.errors import TollgateError
from runs.base.labels import label
from runs.models import ACTIVE_STATUSES, Agent, Message, Run, RunEvent, RunStatus, Session, Step


# --- Agent and Session ---------------------------------------------------


def _loosening(agent: Agent) -> str:
    """The warning for a version that loosened approval: which tools, by whom."""
    return _("Version %(version)s of %(slug)s asks for approval less often than the version before for: "
             "%(tools)s (made by %(user)s).") % {
        "version": agent.version, "slug": agent.slug, "tools": ", ".join(agent.loosened_tools),
        "user": agent.created_by or "-"}


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    """Agent versions: instructions, provider config, tools, approval policy, budgets.

    Only the current version of an agent that is not archived can be changed,
    and a change is saved as the next version by ``update_agent`` (the same
    checks as the API's); adding goes through ``create_agent``.
    """

    form = AgentAdminForm
    list_display = ("slug", "version", "state", "name", "completion_check", "tool_list", "max_turns", "loosening",
                    "created_by", "created_at")
    list_filter = ("is_current", "completion_check")
    list_select_related = ("created_by",)
    ordering = ("slug", "-version")
    search_fields = ("slug", "name", "instructions")
    search_help_text = gettext_lazy("Slug, name or instructions.")
    prepopulated_fields = {"slug": ("name",)}
    actions = ["archive_selected_agents"]
    base_fieldsets = (
        (None, {"fields": ("slug", "name", "instructions")}),
        (gettext_lazy("Model and tools"), {"fields": ("model", "tools", "approval_policy")}),
        (gettext_lazy("Budgets and completion"), {"fields": ("completion_check", "max_turns")}),
    )

    def get_readonly_fields(self, request, obj=None):
        fixed = tuple(f.name for f in Agent._meta.concrete_fields if not f.editable and not f.primary_key)
        return fixed if obj is None else ("slug", *fixed)

    def get_prepopulated_fields(self, request, obj=None):
        return self.prepopulated_fields if obj is None else {}

    def get_fieldsets(self, request, obj=None):
        return with_remaining_fields(self.base_fieldsets, Agent, gettext_lazy("Budgets and more"))

    def has_change_permission(self, request, obj=None):
        """Only the current version of an agent that is not archived; the others are view-only."""
        changeable = obj is None or (obj.is_current and obj.archived_at is None)
        return changeable and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        """Never: runs and sessions keep their version; archive an agent instead."""
        return False

    def has_archive_permission(self, request) -> bool:
        """Archiving needs the delete permission (as ``DELETE /api/agents/{slug}/`` does)."""
        return request.user.has_perm("runs.delete_agent")

    @admin.display(description=gettext_lazy("tools"))
    def tool_list(self, agent: Agent) -> str:
        return ", ".join(agent.tools) if agent.tools else _("none")

    @admin.display(description=gettext_lazy("state"))
    def state(self, agent: Agent) -> str:
        if agent.archived_at is not None:
            return _("archived")
        return _("current") if agent.is_current else _("older version")

    @admin.display(description=gettext_lazy("loosened approval"))
    def loosening(self, agent: Agent) -> str:
        return "⚠ " + ", ".join(agent.loosened_tools) if agent.loosened_tools else ""

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        form.editor = request.user
        return form

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The page of a version that loosened approval warns about it."""
        agent = self.get_object(request, object_id) if request.method == "GET" else None
        if agent is not None and agent.loosened_tools:
            self.message_user(request, _loosening(agent), level=messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request, obj, form, change):
        """Save through ``create_agent`` or ``update_agent`` (a new version), then let ``obj`` be what was saved.

        The form ran the same checks (``check_definition``), so only a change made at the same time can
        make them refuse now: that request fails, and nothing is saved. A new version that loosened
        approval is reported with a warning.
        """
        fields = {name: form.cleaned_data.get(name) for name in DEFINITION_FIELDS}
        if change:
            saved = update_agent(agent=obj, user=request.user, **fields)
        else:
            saved = create_agent(slug=obj.slug, user=request.user, **fields)
        made = saved.pk != obj.pk
        for field in Agent._meta.concrete_fields:
            setattr(obj, field.attname, getattr(saved, field.attname))
        obj._state.adding = False
        if made and saved.loosened_tools:
            self.message_user(request, _loosening(saved), level=messages.WARNING)

    @admin.action(description=gettext_lazy("Archive selected agents"), permissions=["archive"])
    def archive_selected_agents(self, request, queryset):
        """Archive each selected agent's current version via ``archive_agent``; older versions are skipped."""
        archived = 0
        for agent in queryset.current().filter(archived_at__isnull=True).order_by("slug"):
            try:
                archive_agent(agent=agent, user=request.user)
            except TollgateError as exc:
                admin_error(self, request, exc, _("Agent %(agent)s was not archived: %(error)s"), agent=agent.slug)
                continue
            archived += 1
        self.message_user(request, ngettext("Archived %(count)d agent.", "Archived %(count)d agents.", archived)
                          % {"count": archived}, level=messages.SUCCESS)


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    """Conversation threads. Only the title is editable; owner and agent are fixed once created.

    Sessions cannot be deleted here: that would cascade to their runs and
    erase the runs' audit trail.
    """

    list_display = ("id", "title", "owner", "agent", "created_at")
    list_filter = (("agent__slug", AgentSlugFilter), ("created_at", DateFieldListFilter))
    search_fields = ("title", "owner__username", "agent__slug", "=id")
    search_help_text = gettext_lazy("Title, owner's username, agent's slug or session id.")
    list_select_related = ("owner", "agent")
    date_hierarchy = "created_at"
    raw_id_fields = ("owner",)
    inlines = [SessionRunInline]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ("created_at",)
        return ("owner", "agent", "created_at")

    def has_delete_permission(self, request, obj=None):
        return False

    def get_view_on_site_url(self, obj=None):
        """The newest run's page (``Session.get_absolute_url``); none while the session has no run."""
        return super().get_view_on_site_url(obj) if obj is not None and obj.runs.exists() else None


# --- Run -----------------------------------------------------------------


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Runs, view-only; cancelling goes through ``runs.engine.lifecycle.cancel_run_as``.

    No field is editable: ``status`` is a protected FSM field, and the other
    fields are written by the runtime (saving a stale copy here could undo
    a worker's concurrent write). New runs are started from the API or the
    web pages, not here.
    """

    list_display = (
        "id", "agent", "requested_by", "status_", "phase_", "waiting_reason_", "outcome_",
        "outcome_reason_summary", "failure_type", "input_summary", "model_calls", "created_at", "finished_at",
    )
    list_display_links = ("id",)
    list_filter = ("status", WaitingReasonFilter, "phase", "failure_type", "outcome", ("agent__slug", AgentSlugFilter),
                   ("created_at", DateFieldListFilter), ("finished_at", DateFieldListFilter))
    search_fields = ("=id", "input", "final_output", "outcome_reason", "error", "idempotency_key",
                     "requested_by__username", "agent__slug")
    search_help_text = gettext_lazy(
        "Run id, requester's username, agent's slug, or words of the input, output, outcome reason or error.")
    list_select_related = ("agent", "requested_by", "session__agent")
    date_hierarchy = "created_at"
    actions = ["cancel_selected_runs"]
    inlines = [ToolCallInline, InterruptInline, RunEventInline]
    base_fieldsets = (
        (None, {"fields": ("session", "agent", "requested_by", "input", "idempotency_key", "retry_of")}),
        (gettext_lazy("State"), {"fields": (
            "status", "phase", "waiting_reason", "wake_at", "failure_type", "outcome", "outcome_reason", "error",
            "final_output", "cancel_requested_at",
        )}),
        (gettext_lazy("Usage"), {"classes": ["collapse"], "fields": (
            "model_calls", "repair_turns", "incomplete_nudges", "input_tokens", "output_tokens", "last_event_seq",
        )}),
        (gettext_lazy("Times"), {"fields": ("created_at", "updated_at", "started_at", "finished_at")}),
    )

    status_ = column("status", gettext_lazy("Status"), as_word=True)
    phase_ = column("phase", gettext_lazy("Phase"), as_word=True)
    waiting_reason_ = column("waiting_reason", gettext_lazy("Waiting for"), as_word=True)
    outcome_ = column("outcome", gettext_lazy("Outcome"), as_word=True)

    def get_fieldsets(self, request, obj=None):
        return with_remaining_fields(self.base_fieldsets, Run)

    def get_readonly_fields(self, request, obj=None):
        return all_fields(Run)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_cancel_permission(self, request) -> bool:
        """Cancelling needs the model's change permission (the page itself is view-only)."""
        return request.user.has_perm("runs.change_run")

    @admin.display(description=gettext_lazy("input"))
    def input_summary(self, run: Run) -> str:
        return truncated(run.input, 60)

    @admin.display(description=gettext_lazy("why"))
    def outcome_reason_summary(self, run: Run) -> str:
        return truncated(run.outcome_reason, 80)

    @admin.action(description=gettext_lazy("Cancel selected runs"), permissions=["cancel"])
    def cancel_selected_runs(self, request, queryset):
        """Cancel each selected run via ``cancel_run_as``; terminal runs and refusals are reported, not touched."""
        cancelled = requested = 0
        for run in queryset.order_by("pk"):
            if run.status == RunStatus.CANCELLED:  # cancel_run_as would return it unchanged
                self.message_user(request, _("Run %(run)s was already cancelled.") % {"run": run.pk},
                                  level=messages.INFO)
                continue
            try:
                run = cancel_run_as(run=run, user=request.user, reason="cancelled via admin")
            except (TransitionNotAllowed, ConcurrentTransition):
                status = Run.objects.values_list("status", flat=True).get(pk=run.pk)
                self.message_user(
                    request, _("Run %(run)s was not cancelled: it is %(status)s.") % {"run": run.pk, "status": label(status)},
                    level=messages.WARNING,
                )
                continue
            except TollgateError as exc:
                admin_error(self, request, exc, _("Run %(run)s was not cancelled: %(error)s"), run=run.pk)
                continue
            if run.status in ACTIVE_STATUSES:
                requested += 1
                self.message_user(
                    request,
                    _("Run %(run)s is %(status)s: cancellation requested, it stops at its next safe point.")
                    % {"run": run.pk, "status": label(run.status)},
                    level=messages.INFO,
                )
            else:
                cancelled += 1
        if cancelled:
            self.message_user(request, ngettext("Cancelled %(count)d run.", "Cancelled %(count)d runs.", cancelled)
                              % {"count": cancelled}, level=messages.SUCCESS)


# --- Append-only records -------------------------------------------------


@admin.register(Step)
class StepAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Model calls of runs (request, response, usage); append-only."""

    list_display = ("id", "run", "index", "status", "input_tokens", "output_tokens", "started_at", "finished_at")
    list_filter = ("status", ("run__agent__slug", AgentSlugFilter))
    search_fields = ("=run__id", "error")
    list_select_related = ("run",)
    date_hierarchy = "started_at"


@admin.register(Message)
class MessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The conversation history of sessions; append-only."""

    list_display = ("id", "session_id_", "run_id_", "role", "content_summary", "tool_call_id", "created_at")
    list_filter = ("role", ("run__agent__slug", AgentSlugFilter))
    search_fields = ("content", "tool_call_id", "=run__id", "=session__id")
    date_hierarchy = "created_at"

    session_id_ = column("session_id", gettext_lazy("session"))
    run_id_ = column("run_id", gettext_lazy("run"))

    @admin.display(description=gettext_lazy("content"))
    def content_summary(self, message: Message) -> str:
        return truncated(message.content)


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The audit log of every run; append-only."""

    list_display = ("id", "run", "seq", "type", "from_status", "to_status", "actor", "reason", "created_at")
    list_filter = ("type", "to_status", ("run__agent__slug", AgentSlugFilter))
    search_fields = ("=run__id", "actor", "reason", "type")
    list_select_related = ("run",)
    date_hierarchy = "created_at"
