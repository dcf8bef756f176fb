"""Django admin for agents, sessions, runs and their audit trail (docs/design.md#surfaces).

The admin reads everything and writes through services only:

* ``Agent`` is ordinary configuration and fully editable.
* ``Run`` is view-only; the only change an admin can make is the
  "Cancel selected runs" action, which calls ``runs.engine.lifecycle.cancel_run_as``
  (who may cancel: ``Run.objects.cancellable_by``).
  Its change page shows the timeline (``RunEvent``) and the tool calls inline.
* ``Step``, ``Message`` and ``RunEvent`` are append-only records written by
  the runtime: no add, no change, no delete.

``ReadOnlyAdminMixin`` and ``all_fields`` are shared with ``tools.admin``
and ``approvals.admin``.
"""

from django import forms
from django.contrib import admin, messages
from django.db.models import Model
from django.utils.text import Truncator
from django.utils.translation import gettext as _, gettext_lazy, ngettext
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from config.error_display import admin_error
from config.strict_json import StrictJSONFormField
from runs.engine.agents import config_errors, may_loosen_policy
from runs.labels import label
from runs.models import ACTIVE_STATUSES, Agent, Message, Run, RunEvent, Session, Step
from runs.engine.lifecycle import cancel_run_as
from runs.errors import TollgateError
from tools.models import ToolCall


def all_fields(model: type[Model]) -> tuple[str, ...]:
    """Names of every concrete field of ``model``, in declaration order."""
    return tuple(field.name for field in model._meta.concrete_fields)


def truncated(text: str, length: int = 80) -> str:
    """``text`` on one line, cut to ``length`` characters for a changelist column."""
    return Truncator(" ".join((text or "").split())).chars(length)


def with_remaining_fields(fieldsets, model: type[Model], title: str = "More") -> tuple:
    """``fieldsets`` plus a last section with every other non-key field of ``model``.

    Keeps a hand-arranged page complete when fields are added to the model.
    """
    listed = {name for _, options in fieldsets for name in options["fields"]}
    rest = tuple(f.name for f in model._meta.concrete_fields if not f.primary_key and f.name not in listed)
    return tuple(fieldsets) + (((title, {"fields": rest}),) if rest else ())


class ReadOnlyAdminMixin:
    """View-only admin for records only the runtime writes: no add, change or delete.

    Every concrete field is shown read-only (including ``auto_now_add``
    timestamps, which a form would otherwise hide). Works for ``ModelAdmin``
    and inlines alike.
    """

    def get_readonly_fields(self, request, obj=None):
        return all_fields(self.model)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# --- Agent and Session ---------------------------------------------------


class AgentAdminForm(forms.ModelForm):
    """Checks an edited agent the way the API does (``runs.engine.agents.config_errors``, strict JSON).

    ``may_loosen`` is set by ``AgentAdmin.get_form`` from the user's permission.
    """

    may_loosen = False

    class Meta:
        model = Agent
        fields = "__all__"
        field_classes = {"model": StrictJSONFormField, "tools": StrictJSONFormField,
                         "approval_policy": StrictJSONFormField}

    def clean(self):
        data = super().clean()
        errors = config_errors(model=data.get("model"), tools=data.get("tools") or [],
                               approval_policy=data.get("approval_policy") or {},
                               completion_check=data.get("completion_check") or "", may_loosen=self.may_loosen)
        for field, problems in errors.items():
            self.add_error(field if field in self.fields else None, problems)
        return data


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    """Agent definitions: instructions, provider config, tools, approval policy, budgets."""

    form = AgentAdminForm
    list_display = ("slug", "name", "completion_check", "max_turns", "created_at")
    search_fields = ("slug", "name", "instructions")
    list_filter = ("completion_check",)
    prepopulated_fields = {"slug": ("name",)}
    base_fieldsets = (
        (None, {"fields": ("slug", "name", "instructions")}),
        ("Model and tools", {"fields": ("model", "tools", "approval_policy")}),
        ("Budgets and completion", {"fields": ("completion_check", "max_turns")}),
    )

    def get_readonly_fields(self, request, obj=None):
        return tuple(f.name for f in Agent._meta.concrete_fields if not f.editable and not f.primary_key)

    def get_fieldsets(self, request, obj=None):
        return with_remaining_fields(self.base_fieldsets, Agent, "Budgets and more")

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        form.may_loosen = may_loosen_policy(request.user)
        return form

    def save_model(self, request, obj, form, change):
        """A changed approval policy replaces the tools' rules only if its editor may loosen them (recorded)."""
        if not change or "approval_policy" in form.changed_data:
            obj.approval_policy_granted_by = request.user if form.may_loosen and obj.approval_policy else None
        super().save_model(request, obj, form, change)


class SessionRunInline(ReadOnlyAdminMixin, admin.TabularInline):
    """The runs of a session, newest first, each linking to its run page."""

    model = Run
    fields = ("status", "phase", "waiting_reason", "outcome", "failure_type", "input_summary", "created_at")
    ordering = ("-created_at",)
    show_change_link = True
    extra = 0

    def get_readonly_fields(self, request, obj=None):
        return self.fields

    @admin.display(description=gettext_lazy("input"))
    def input_summary(self, run: Run) -> str:
        return truncated(run.input)


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    """Conversation threads. Only the title is editable; owner and agent are fixed once created.

    Sessions cannot be deleted here: that would cascade to their runs and
    erase the runs' audit trail.
    """

    list_display = ("id", "title", "owner", "agent", "created_at")
    list_filter = ("agent",)
    search_fields = ("title", "owner__username", "agent__slug", "=id")
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


# --- Run -----------------------------------------------------------------


class RunEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    """The run's timeline: every event in ``seq`` order, read-only."""

    model = RunEvent
    fields = ("seq", "type", "from_status", "to_status", "actor", "reason", "payload", "created_at")
    ordering = ("seq",)
    extra = 0
    verbose_name = "timeline event"
    verbose_name_plural = "Timeline"


class ToolCallInline(ReadOnlyAdminMixin, admin.TabularInline):
    """The run's tool calls in the order they were proposed, read-only."""

    model = ToolCall
    fields = ("id", "name", "status", "arguments", "side_effect", "attempts", "error", "created_at", "finished_at")
    ordering = ("id",)
    show_change_link = True
    extra = 0

    def get_readonly_fields(self, request, obj=None):
        return self.fields


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Runs, view-only; cancelling goes through ``runs.engine.lifecycle.cancel_run_as``.

    No field is editable: ``status`` is a protected FSM field, and the other
    fields are written by the runtime (saving a stale copy here could undo
    a worker's concurrent write). New runs are started from the API or the
    web pages, not here.
    """

    list_display = (
        "id", "agent", "requested_by", "status", "phase", "waiting_reason", "outcome", "outcome_reason_summary",
        "failure_type", "input_summary", "model_calls", "created_at", "finished_at",
    )
    list_display_links = ("id",)
    list_filter = ("status", "phase", "waiting_reason", "failure_type", "outcome", "agent")
    search_fields = ("=id", "input", "final_output", "outcome_reason", "error", "idempotency_key", "requested_by__username", "agent__slug")
    list_select_related = ("agent", "requested_by", "session__agent")
    date_hierarchy = "created_at"
    actions = ["cancel_selected_runs"]
    inlines = [ToolCallInline, RunEventInline]
    base_fieldsets = (
        (None, {"fields": ("session", "agent", "requested_by", "input", "idempotency_key", "retry_of")}),
        ("State", {"fields": (
            "status", "phase", "waiting_reason", "wake_at", "failure_type", "outcome", "outcome_reason", "error",
            "final_output", "cancel_requested_at",
        )}),
        ("Usage", {"fields": (
            "model_calls", "repair_turns", "incomplete_nudges", "input_tokens", "output_tokens", "last_event_seq",
        )}),
        ("Times", {"fields": ("created_at", "updated_at", "started_at", "finished_at")}),
    )

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
    list_filter = ("status", "run__agent")
    search_fields = ("=run__id", "error")
    list_select_related = ("run",)
    date_hierarchy = "started_at"


@admin.register(Message)
class MessageAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The conversation history of sessions; append-only."""

    list_display = ("id", "session_id", "run_id", "role", "content_summary", "tool_call_id", "created_at")
    list_filter = ("role", "run__agent")
    search_fields = ("content", "tool_call_id", "=run__id", "=session__id")
    date_hierarchy = "created_at"

    @admin.display(description=gettext_lazy("content"))
    def content_summary(self, message: Message) -> str:
        return truncated(message.content)


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The audit log of every run; append-only."""

    list_display = ("id", "run", "seq", "type", "from_status", "to_status", "actor", "reason", "created_at")
    list_filter = ("type", "to_status", "run__agent")
    search_fields = ("=run__id", "actor", "reason", "type")
    list_select_related = ("run",)
    date_hierarchy = "created_at"
