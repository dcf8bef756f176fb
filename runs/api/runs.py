"""REST API for agents, runs and sessions: thin views over ``runs.engine`` services.

Visibility is ``runs.access`` (``config.api.VisibleRowsMixin``): staff
and holders of the decide permission see every run and session, everyone
else only the runs they requested and the sessions they own; another
user's run or session answers 404 on every verb. Who may cancel is
``Run.objects.cancellable_by``, checked by ``cancel_run_as``. Creating an
agent needs staff and the ``runs.add_agent`` permission, as in the admin;
changing one (a new version) ``runs.change_agent``, archiving it ``runs.delete_agent``.
Starting runs has its own throttle rate (``runs``). Every POST honours
``Idempotency-Key`` (``config.idempotency``); lists are cursor pages
(``config.pagination``) with the filters of ``runs.api.filters``. Service
exceptions become HTTP answers in ``config.api.exception_handler``.
"""

from django.db.models import prefetch_related_objects
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import DjangoModelPermissions, IsAdminUser, IsAuthenticated
from rest_framework.response import Response

from config.api import VisibleRowsMixin
from config.idempotency import REPLAYED_HEADER, IdempotentPostMixin
from config.pagination import EventCursorPagination, OldestFirstCursorPagination
from config.throttles import check_run_start_rate
from runs.engine.agents import archive_agent, create_agent, update_agent
from runs.engine.lifecycle import SubmitOutcome, cancel_run_as, retry_run, start_runs, submit_input
from runs.engine.sessions import open_session
from runs.api.filters import RunFilter, SessionFilter
from runs.models import Agent, Run, Session
from runs.selectors import session_messages, with_final_output_facts, with_pending_waits
from runs.api.serializers import (
    AgentCreateSerializer,
    AgentSerializer,
    AgentUpdateSerializer,
    CancelSerializer,
    MessageSerializer,
    RunBatchCreateSerializer,
    RunCreateSerializer,
    RunEventSerializer,
    RunSerializer,
    SessionCreateSerializer,
    SessionSerializer,
    StepSerializer,
    ToolCallSerializer,
    decided_items_prefetch,
)


@extend_schema_view(
    list=extend_schema(summary="List agents (current versions, archived ones left out)"),
    retrieve=extend_schema(summary="One agent's current version (archived ones too)"),
)
class AgentViewSet(IdempotentPostMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Agent definitions, in versions: any user may list and read them; staff with ``runs.add_agent``,
    ``runs.change_agent`` or ``runs.delete_agent`` may create, change (a new version) or archive them.

    ``{slug}`` names the agent's current version; ``versions/`` lists them all, oldest first.
    PUT is not offered: a change names only the fields it changes (PATCH).
    """

    serializer_class = AgentSerializer
    lookup_field = "slug"

    def get_queryset(self):
        agents = Agent.objects.select_related("created_by")
        return agents.listed() if self.action == "list" else agents.current()

    def get_permissions(self):
        if self.action in ("create", "partial_update", "destroy"):
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

    @extend_schema(summary="Change an agent: a new version (staff with the change permission)",
                   request=AgentUpdateSerializer,
                   responses={200: OpenApiResponse(AgentSerializer, description="The new current version (the "
                                                                                "current one if nothing changed)."),
                              409: OpenApiResponse(description="The agent is archived (`agent_archived`), or "
                                                               "another change was made at the same time.")})
    def partial_update(self, request, slug=None):
        """Validate the body's shape, then let ``update_agent`` check it and save the next version."""
        agent = self.get_object()
        body = AgentUpdateSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        agent = update_agent(agent=agent, user=request.user, **body.validated_data)
        return Response(self.get_serializer(agent).data)

    @extend_schema(summary="Archive an agent (staff with the delete permission)",
                   responses={204: OpenApiResponse(description="Archived (again, if it was): no new runs or "
                                                               "sessions; its runs stay readable.")})
    def destroy(self, request, slug=None):
        """Archive through ``archive_agent``; nothing is deleted, and archiving again answers the same."""
        archive_agent(agent=self.get_object(), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(summary="Every version of the agent, oldest first", responses={200: AgentSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=OldestFirstCursorPagination, filter_backends=[])
    def versions(self, request, slug=None):
        """All versions of the agent's slug, from version 1 on (cursor-paginated)."""
        agent = self.get_object()
        page = self.paginate_queryset(Agent.objects.filter(slug=agent.slug).select_related("created_by"))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)


@extend_schema_view(
    list=extend_schema(summary="List runs visible to you"),
    retrieve=extend_schema(summary="One run"),
)
class RunViewSet(IdempotentPostMixin, VisibleRowsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Runs: start one, read it with its events, steps and tool calls, cancel it."""

    serializer_class = RunSerializer
    queryset = with_final_output_facts(with_pending_waits(Run.objects.select_related("agent", "requested_by")
                                                          .prefetch_related(decided_items_prefetch())))
    owner_field = "requested_by"
    filterset_class = RunFilter

    def get_throttles(self):
        """The default throttles; starting a run also counts against the ``runs`` rate."""
        self.throttle_scope = "runs" if self.action == "create" else None
        return super().get_throttles()


    @extend_schema(
        summary="Start a run",
        request=RunCreateSerializer,
        responses={201: RunSerializer,
                   200: OpenApiResponse(RunSerializer, description="supplement: the input joined this busy run."),
                   409: OpenApiResponse(description="reject: the session already has an active run "
                                                    "(`details.active_run`).")},
    )
    def create(self, request):
        """Start a run (or supplement one) through ``submit_input``; 201 created, 200 supplemented.

        The ``Idempotency-Key`` is also kept on the run, so a key used
        more than 24 hours ago still answers with the run it started.
        """
        body = RunCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        submitted = submit_input(agent=data["agent"], user=request.user, input=data["input"],
                                 session=data.get("session"), idempotency_key=self.idempotency_key,
                                 multitask_strategy=data["multitask_strategy"], start_at=data["start_at"])
        code = status.HTTP_200_OK if submitted.outcome == SubmitOutcome.SUPPLEMENTED else status.HTTP_201_CREATED
        headers = {REPLAYED_HEADER: "true"} if submitted.replayed else None
        return Response(self.get_serializer(submitted.run).data, status=code, headers=headers)

    @extend_schema(
        summary="Start many runs at once",
        request=RunBatchCreateSerializer,
        responses={201: RunSerializer(many=True),
                   400: OpenApiResponse(description="An input is empty or too long, there are more than "
                                                    "TOLLGATE['RUN_BATCH_MAX'] or more than the runs rate allows "
                                                    "at all, or start_at is bad; no run was started."),
                   409: OpenApiResponse(description="The agent was archived; no run was started."),
                   413: OpenApiResponse(description="The body is over DATA_UPLOAD_MAX_MEMORY_SIZE; no run was "
                                                    "started."),
                   429: OpenApiResponse(description="The runs rate has no room for this many runs now "
                                                    "(`details.retry_after`); no run was started.")},
    )
    @action(detail=False, methods=["post"], pagination_class=None, filter_backends=[])
    def batch(self, request):
        """Start one run per input, each in a new session, in one transaction (``start_runs``); 201 with the runs, in order.

        All or none. Each run counts against the ``runs`` throttle rate
        (``check_run_start_rate``), once the batch passed every other check,
        so a refused batch spends none of it. With an ``Idempotency-Key``,
        the same request sent again within 24 hours answers the same runs.
        """
        body = RunBatchCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        runs = start_runs(agent=data["agent"], user=request.user, inputs=data["inputs"], start_at=data["start_at"],
                          admit=lambda count: check_run_start_rate(request, count=count))
        prefetch_related_objects(runs, decided_items_prefetch())  # one query for all their decisions (none yet)
        return Response(self.get_serializer(runs, many=True).data, status=status.HTTP_201_CREATED)

    @extend_schema(summary="Retry a failed or cancelled run", request=CancelSerializer,
                   responses={201: RunSerializer, 403: OpenApiResponse(description="Only the requester may retry."),
                              409: OpenApiResponse(description="The run is not failed or cancelled, or it was "
                                                                   "retried already (`details.retry`).")})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """A new run with ``retry_of`` set: same session, agent and input (``retry_run``); the body must be empty.

        Side effects the old run achieved are answered with their stored
        results, not done again; reads run afresh.
        """
        run = self.get_object()
        CancelSerializer(data=request.data).is_valid(raise_exception=True)
        submitted = retry_run(run=run, user=request.user, idempotency_key=self.idempotency_key)
        headers = {REPLAYED_HEADER: "true"} if submitted.replayed else None
        return Response(self.get_serializer(submitted.run).data, status=status.HTTP_201_CREATED, headers=headers)

    @extend_schema(summary="The run's events, in order", responses={200: RunEventSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=EventCursorPagination, filter_backends=[])
    def events(self, request, pk=None):
        """The run's append-only event log by ``seq`` (cursor-paginated)."""
        return self._run_page(lambda run: run.events.order_by("seq"), RunEventSerializer)

    @extend_schema(summary="The run's steps (model calls), in order", responses={200: StepSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=OldestFirstCursorPagination, filter_backends=[])
    def steps(self, request, pk=None):
        """Every model call of the run, in order: status, timings, usage, finish reason, error (cursor-paginated)."""
        return self._run_page(lambda run: run.steps.order_by("id"), StepSerializer)

    @extend_schema(summary="The run's tool calls", responses={200: ToolCallSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="tool-calls", pagination_class=OldestFirstCursorPagination,
            filter_backends=[])
    def tool_calls(self, request, pk=None):
        """Every tool call the model proposed in this run, in order."""
        return self._run_page(lambda run: run.tool_calls.order_by("id"), ToolCallSerializer)

    def _run_page(self, rows, serializer_class):
        """One cursor page of ``rows(run)`` for the run in the URL (404 unless visible), serialized."""
        page = self.paginate_queryset(rows(self.get_object()))
        return self.get_paginated_response(serializer_class(page, many=True).data)

    @extend_schema(summary="Cancel the run", request=CancelSerializer,
                   responses={200: OpenApiResponse(RunSerializer, description="Cancelled, or asked to be (a running "
                                                                          "run stops at its next safe point); a "
                                                                          "cancelled run again, unchanged."),
                              403: OpenApiResponse(description="You may not cancel this run."),
                              409: OpenApiResponse(description="The run completed or failed; `details.status` is "
                                                               "its status.")})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel through ``cancel_run_as``: at once if queued or waiting, at the next safe point if running.

        Only users the run is ``cancellable_by`` may cancel (403); the
        body, if any, must be empty. Cancelling a cancelled run answers it unchanged.
        """
        run = self.get_object()
        CancelSerializer(data=request.data).is_valid(raise_exception=True)
        run = cancel_run_as(run=run, user=request.user)
        return Response(self.get_serializer(run).data)


@extend_schema_view(
    list=extend_schema(summary="List sessions visible to you"),
    retrieve=extend_schema(summary="One session"),
)
class SessionViewSet(IdempotentPostMixin, VisibleRowsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     viewsets.GenericViewSet):
    """Sessions (conversation threads): open one, read it, its message history and its runs.

    Start a run in a session with ``POST /api/runs/`` and ``"session": id``.
    """

    serializer_class = SessionSerializer
    queryset = Session.objects.select_related("agent", "owner")
    owner_field = "owner"
    filterset_class = SessionFilter


    @extend_schema(summary="Open a session", request=SessionCreateSerializer, responses={201: SessionSerializer})
    def create(self, request):
        """Open a session of an agent for the requesting user, with a title and metadata (``open_session``)."""
        body = SessionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        session = open_session(user=request.user, **body.validated_data)
        return Response(self.get_serializer(session).data, status=status.HTTP_201_CREATED)

    @extend_schema(summary="The session's message history, oldest first", responses={200: MessageSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=OldestFirstCursorPagination, filter_backends=[])
    def messages(self, request, pk=None):
        """Every message of every run of the session, in the order they were written (immutable)."""
        session = self.get_object()
        page = self.paginate_queryset(session_messages(session_id=session.pk))
        return self.get_paginated_response(MessageSerializer(page, many=True).data)

    @extend_schema(summary="The session's runs, newest first", responses={200: RunSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def runs(self, request, pk=None):
        """The runs of the session (all its owner's), newest first."""
        session = self.get_object()
        page = self.paginate_queryset(with_final_output_facts(with_pending_waits(
            session.runs.select_related("agent", "requested_by").prefetch_related(decided_items_prefetch()))))
        return self.get_paginated_response(RunSerializer(page, many=True).data)
