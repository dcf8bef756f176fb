"""REST API for the inbox: list items, approve, reject or reconcile them, answer questions.

Decisions go through ``approvals.services`` (``decide_interrupt``,
``reconcile_interrupt``, ``answer_interrupt``), which check that the item is still pending
(409). An item of a run you may not see is 404 on every verb, like a
missing one; on one you see, the permission is checked (403) before
anything else about the item is said. Decisions honour ``Idempotency-Key``
(``config.idempotency``); the list is cursor pages with the filters of
``approvals.filters``.
"""

from django.core.exceptions import PermissionDenied
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from approvals.filters import InterruptFilter
from approvals.models import Decision, Interrupt
from approvals.serializers import (
    ApproveSerializer,
    InterruptSerializer,
    ReconcileSerializer,
    RejectSerializer,
    RespondSerializer,
)
from approvals.services import answer_interrupt, can_decide, decide_interrupt, reconcile_interrupt
from config.api import VisibleRowsMixin
from config.idempotency import IdempotentPostMixin

DECISION_RESPONSES = {
    200: InterruptSerializer,
    400: OpenApiResponse(description="Edited arguments do not match the tool's schema."),
    403: OpenApiResponse(description="You may not decide this item."),
    409: OpenApiResponse(description="The item is no longer pending; `details.status` is its current status."),
}


@extend_schema_view(
    list=extend_schema(summary="List inbox items visible to you, newest first"),
    retrieve=extend_schema(summary="One inbox item"),
)
class InterruptViewSet(IdempotentPostMixin, VisibleRowsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet):
    """Inbox items, with the same visibility as their runs; filters in ``approvals.filters``."""

    serializer_class = InterruptSerializer
    queryset = Interrupt.objects.select_related("run", "tool_call", "resolved_by")
    owner_field = "run__requested_by"
    filterset_class = InterruptFilter

    def _decidable_item(self) -> Interrupt:
        """The item of the URL if visible (else 404) and the user may decide it (else 403)."""
        interrupt = self.get_object()
        if not can_decide(self.request.user, interrupt):
            raise PermissionDenied("You may not decide this item.")
        return interrupt

    def _decide(self, request, pk, decision: str, body_class):
        interrupt = self._decidable_item()
        body = body_class(data=request.data)
        body.is_valid(raise_exception=True)
        interrupt = decide_interrupt(
            interrupt=interrupt,
            user=request.user,
            decision=decision,
            comment=body.validated_data["comment"],
            edited_arguments=body.validated_data.get("arguments"),
        )
        return Response(self.get_serializer(interrupt).data)

    @extend_schema(summary="Approve, optionally with edited arguments", request=ApproveSerializer,
                   responses=DECISION_RESPONSES)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve the item; the tool call runs (with edited arguments if given) and the run resumes."""
        return self._decide(request, pk, Decision.APPROVED, ApproveSerializer)

    @extend_schema(summary="Reject, with an optional comment", request=RejectSerializer,
                   responses=DECISION_RESPONSES)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        """Reject the item; the tool call never runs and the model is told why."""
        return self._decide(request, pk, Decision.REJECTED, RejectSerializer)

    @extend_schema(summary="Settle an unknown outcome: it happened (with the result) or not, with evidence",
                   request=ReconcileSerializer, responses=DECISION_RESPONSES)
    @action(detail=True, methods=["post"])
    def reconcile(self, request, pk=None):
        """Settle a reconciliation item; the tool call becomes succeeded or failed and the run resumes."""
        interrupt = self._decidable_item()
        body = ReconcileSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        interrupt = reconcile_interrupt(
            interrupt=interrupt,
            user=request.user,
            succeeded=body.validated_data["succeeded"],
            evidence=body.validated_data["evidence"],
            result=body.validated_data["result"],
        )
        return Response(self.get_serializer(interrupt).data)

    @extend_schema(summary="Answer a question (an input item); the answer is the ask_user call's result",
                   request=RespondSerializer, responses={
                       **DECISION_RESPONSES,
                       400: OpenApiResponse(description="Empty answer, or not one of the question's options."),
                       403: OpenApiResponse(description="Only the run's requester or staff may answer.")})
    @action(detail=True, methods=["post"])
    def respond(self, request, pk=None):
        """Answer an input item; the run resumes with the answer as the tool result."""
        interrupt = self._decidable_item()
        body = RespondSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        interrupt = answer_interrupt(interrupt=interrupt, user=request.user, answer=body.validated_data["answer"])
        return Response(self.get_serializer(interrupt).data)
