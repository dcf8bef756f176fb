"""REST API for the tool registry: what agents may call, and under which policy."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers

from config.pagination import WholeListPagination
from tools.registry import offered_tools


class ToolSerializer(serializers.Serializer):
    """A registered tool: its JSON Schema, whether it has side effects, its approval rule."""

    name = serializers.CharField()
    description = serializers.CharField()
    parameters = serializers.JSONField(help_text="JSON Schema (draft 2020-12) of the arguments object.")
    side_effect = serializers.BooleanField()
    approval = serializers.CharField(help_text='An approval rule (see tools.policy), e.g. "amount > 50" or '
                                               '"sum(amount) per target within 30d > 50".')
    target_key = serializers.CharField(help_text="The argument naming what a call acts on (per-target rules).")
    requester_may_decide = serializers.BooleanField(help_text="Whether a run's requester may decide its items.")
    timeout_s = serializers.FloatField()
    location = serializers.CharField(help_text='Where a tool that runs outside Tollgate lives ("HTTP bookings '
                                               '/tools/book", "MCP server files"); empty for an in-process tool.')


@extend_schema(summary="List registered tools (all on one page)")
class ToolListView(generics.ListAPIView):
    """Every tool an agent may be given, by name (registered ones, then MCP servers' tools not held for an
    operator): the list is small, so it is one page."""

    serializer_class = ToolSerializer
    pagination_class = WholeListPagination
    filter_backends = []

    def get_queryset(self):
        return offered_tools()
