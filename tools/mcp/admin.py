"""Django admin for MCP tools: the cached listings, their events, and accepting a changed definition."""

from django import forms
from django.contrib import admin, messages
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from runs.admin.base import ReadOnlyAdminMixin, truncated
from runs.base.errors import Forbidden
from tools.mcp.discovery import accept, rule_problem, set_rule
from tools.models import McpTool, McpToolEvent


class McpToolEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    """What happened to the tool's definition, newest first."""

    model = McpToolEvent
    fields = ("created_at", "kind", "actor", "detail")
    extra = 0


class McpToolRuleForm(forms.ModelForm):
    """The one field an operator edits: the tool's approval rule, checked by ``rule_problem`` for the user."""

    class Meta:
        model = McpTool
        fields = ["approval_rule"]

    def clean(self):
        cleaned = super().clean()
        problem = rule_problem(self.instance, cleaned.get("approval_rule", ""), user=self.user)
        if problem:
            self.add_error("approval_rule", problem)
        return cleaned


@admin.register(McpTool)
class McpToolAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The tools MCP servers listed; a held one (changed since accepted) is refused until accepted here.
    Everything is read-only but the operator's approval rule (``tools.mcp.discovery.set_rule``: checked,
    recorded as a ``rule`` event), for users with the change permission."""

    form = McpToolRuleForm
    list_display = ("full_name", "server", "listed", "is_held", "approval_rule", "description_summary",
                    "refreshed_at", "accepted_at")
    list_filter = ("server", "listed")
    search_fields = ("server", "name", "description")
    actions = ["accept_selected"]
    inlines = [McpToolEventInline]

    @admin.display(description=gettext_lazy("held for an operator"), boolean=True)
    def is_held(self, tool: McpTool) -> bool:
        return tool.held

    @admin.display(description=gettext_lazy("description"))
    def description_summary(self, tool: McpTool) -> str:
        return truncated(tool.description, 60)

    def get_readonly_fields(self, request, obj=None):
        return tuple(name for name in super().get_readonly_fields(request, obj) if name != "approval_rule")

    def has_change_permission(self, request, obj=None):
        return request.user.has_perm("tools.change_mcptool")

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.user = request.user
        return form

    def save_model(self, request, obj, form, change):
        """Through ``set_rule`` (its event), never a plain save: only the rule is the operator's to change."""
        set_rule(McpTool.objects.get(pk=obj.pk), form.cleaned_data["approval_rule"], user=request.user)

    def has_accept_permission(self, request) -> bool:
        """Accepting a changed definition needs the model's change permission (the page itself is view-only);
        one that loosens the tool needs the loosen permission too (``accept`` checks)."""
        return request.user.has_perm("tools.change_mcptool")

    @admin.action(description=gettext_lazy("Accept the listed definition of the selected tools"),
                  permissions=["accept"])
    def accept_selected(self, request, queryset):
        """Accept each held tool's listed definition (``tools.mcp.discovery.accept``); others are left as they are,
        and so is one whose acceptance would loosen it when the user may not (the reason is shown)."""
        accepted = refused = 0
        for tool in queryset.order_by("pk"):
            try:
                accepted += accept(tool, user=request.user)
            except Forbidden as exc:
                refused += 1
                self.message_user(request, str(exc), level=messages.ERROR)
        if accepted:
            self.message_user(request, ngettext("Accepted %(count)d tool.", "Accepted %(count)d tools.", accepted)
                              % {"count": accepted}, level=messages.SUCCESS)
        elif not refused:
            self.message_user(request, _("None of the selected tools was held."), level=messages.INFO)
