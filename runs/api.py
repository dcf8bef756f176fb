"""REST API for agents and runs: thin views over ``runs.services`` and ``runs.engine.agents``.

Visibility (``runs.selectors``): staff and holders of the decide
permission see every run, everyone else only the runs they requested;
another user's run answers 404 on every verb. The requester, staff and
decide-permission holders may cancel a run. Creating an agent needs staff
and the ``runs.add_agent`` permission, as in the admin. Starting runs has
its own throttle rate (``runs``). Service exceptions become HTTP answers
in ``config.api.exception_handler``.
"""

from django.core.exceptions import PermissionDenied
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import DjangoModelPermissions, IsAdminUser, IsAuthenticated
from rest_framework.response import Response

from runs.engine.agents import create_agent
from runs.models import Agent, Run
from runs.selectors import run_can_cancel, user_sees_all_runs
from runs.serializers import (
    AgentCreateSerializer,
    AgentSerializer,
    CancelSerializer,
    RunCreateSerializer,
    RunEventSerializer,
    RunSerializer,
    ToolCallSerializer,
)
from runs.services import actor_for
from runs.engine.lifecycle import cancel_run, retry_run, submit_input

IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_MAX_LENGTH = Run._meta.get_field("idempotency_key").max_length


class EventCursorPagination(CursorPagination):
    """A run's events, oldest first, in stable ``seq`` order; 100 per page unless ``?page_size=``."""

    ordering = "seq"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


@extend_schema_view(
    list=extend_schema(summary="List agents"),
    retrieve=extend_schema(summary="One agent"),
)
class AgentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Agent definitions: any user may list them; staff with ``runs.add_agent`` may create them."""

    queryset = Agent.objects.all()
    serializer_class = AgentSerializer
    lookup_field = "slug"

    def get_permissions(self):
        if self.action == "create":
            return [IsAdminUser(), DjangoModelPermissions()]
        return [IsAuthenticated()]

    @extend_schema(summary="Create an agent (staff with the add permission)", request=AgentCreateSerializer,
                   responses={201: AgentSerializer})
    def create(self, request):
        """Validate the body's shape, then let ``create_agent`` check and save it."""
        body = AgentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        agent = create_agent(**body.validated_data, user=request.user)
        return Response(self.get_serializer(agent).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    list=extend_schema(summary="List runs visible to you"),
    retrieve=extend_schema(summary="One run"),
)
class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Runs: start one, read it with its events and tool calls, cancel it."""

    serializer_class = RunSerializer
    queryset = Run.objects.select_related("agent", "requested_by")

    def get_throttles(self):
        """The default throttles; starting a run also counts against the ``runs`` rate."""
        self.throttle_scope = "runs" if self.action == "create" else None
        return super().get_throttles()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return self.queryset.none()
        if user_sees_all_runs(user=self.request.user):
            return self.queryset.all()
        return self.queryset.filter(requested_by=self.request.user)

    @extend_schema(
        summary="Start a run",
        request=RunCreateSerializer,
        parameters=[OpenApiParameter(
            IDEMPOTENCY_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER,
            description="Repeating a request with the same key returns the run it created instead of a new one.",
        )],
        responses={201: RunSerializer,
                   200: OpenApiResponse(RunSerializer, description="supplement: the input joined this busy run."),
                   409: OpenApiResponse(description="reject: the session already has an active run."),
                   422: OpenApiResponse(description="The Idempotency-Key was used for a different request.")},
    )
    def create(self, request):
        """Start a run (or supplement one) through ``submit_input``; 201 created, 200 supplemented, 422 key reused."""
        body = RunCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        key, refused = self._idempotency_key(request)
        if refused:
            return refused
        data = body.validated_data
        submitted = submit_input(agent=data["agent"], user=request.user, input=data["input"],
                                 session=data.get("session"), idempotency_key=key,
                                 multitask_strategy=data["multitask_strategy"], start_at=data["start_at"])
        code = status.HTTP_200_OK if submitted.outcome == "supplemented" else status.HTTP_201_CREATED
        return Response(self.get_serializer(submitted.run).data, status=code)

    @staticmethod
    def _idempotency_key(request) -> tuple[str | None, Response | None]:
        """(the ``Idempotency-Key`` header or None, a 400 answer when it is too long)."""
        key = request.headers.get(IDEMPOTENCY_HEADER) or None
        if key and len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
            return None, Response({"detail": f"The {IDEMPOTENCY_HEADER} header is longer than "
                                             f"{IDEMPOTENCY_KEY_MAX_LENGTH} characters."},
                                  status=status.HTTP_400_BAD_REQUEST)
        return key, None

    @extend_schema(summary="Retry a failed or cancelled run", request=CancelSerializer,
                   parameters=[OpenApiParameter(
                       IDEMPOTENCY_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER,
                       description="Repeating a retry with the same key returns the run it created.")],
                   responses={201: RunSerializer, 403: OpenApiResponse(description="Only the requester may retry."),
                              409: OpenApiResponse(description="The run is not failed or cancelled.")})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """A new run with ``retry_of`` set: same session, agent and input (``retry_run``); the body must be empty.

        Side effects the old run achieved are answered with their stored
        results, not done again; reads run afresh.
        """
        run = self.get_object()
        CancelSerializer(data=request.data).is_valid(raise_exception=True)
        key, refused = self._idempotency_key(request)
        if refused:
            return refused
        submitted = retry_run(run=run, user=request.user, idempotency_key=key)
        return Response(self.get_serializer(submitted.run).data, status=status.HTTP_201_CREATED)

    @extend_schema(summary="The run's events, in order", responses={200: RunEventSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=EventCursorPagination)
    def events(self, request, pk=None):
        """The run's append-only event log by ``seq`` (cursor-paginated)."""
        run = self.get_object()
        page = self.paginate_queryset(run.events.order_by("seq"))
        return self.get_paginated_response(RunEventSerializer(page, many=True).data)

    @extend_schema(summary="The run's tool calls", responses={200: ToolCallSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="tool-calls")
    def tool_calls(self, request, pk=None):
        """Every tool call the model proposed in this run, in order."""
        run = self.get_object()
        page = self.paginate_queryset(run.tool_calls.order_by("id"))
        return self.get_paginated_response(ToolCallSerializer(page, many=True).data)

    @extend_schema(summary="Cancel the run", request=CancelSerializer,
                   responses={200: RunSerializer, 403: OpenApiResponse(description="You may not cancel this run."),
                              409: OpenApiResponse(description="The run already ended; the body names its `status`.")})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel through ``cancel_run``: at once if queued or waiting, at the next safe point if running.

        Only the requester, staff and decide-permission holders may cancel;
        the body, if any, must be empty.
        """
        run = self.get_object()
        CancelSerializer(data=request.data).is_valid(raise_exception=True)
        user = request.user
        if not run_can_cancel(user=user, run=run):
            raise PermissionDenied("You may not cancel this run.")
        run = cancel_run(run=run, actor=actor_for(user))
        return Response(self.get_serializer(run).data)
