"""Django admin for tool calls (docs/design.md#surfaces).

``ToolCall`` is an audit record written only by ``tools.services``: view-only.
"""

from django.contrib import admin
from django.utils.translation import gettext_lazy

from runs.admin.base import AgentSlugFilter, ReadOnlyAdminMixin, truncated
from tools.models import ToolCall


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Tool calls the models proposed and what became of them; append-only."""

    list_display = (
        "id", "run", "name", "status", "side_effect", "arguments_summary", "attempts", "created_at", "finished_at",
    )
    list_filter = ("name", "status", "side_effect", ("run__agent__slug", AgentSlugFilter))
    search_fields = ("=id", "=run__id", "name", "provider_call_id", "idempotency_key", "raw_arguments", "error")
    search_help_text = gettext_lazy("Call or run id, tool name, the model's call id, idempotency key, arguments or error.")
    list_select_related = ("run",)
    date_hierarchy = "created_at"

    @admin.display(description=gettext_lazy("arguments"))
    def arguments_summary(self, tool_call: ToolCall) -> str:
        return truncated(tool_call.raw_arguments if tool_call.arguments is None else str(tool_call.arguments), 60)



# The MCP tools' admin registers itself on import.
from tools.mcp import admin as mcp_admin  # noqa: E402,F401
