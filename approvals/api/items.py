"""REST API for the inbox: list items, approve, reject or reconcile them, answer questions.

Decisions go through ``approvals.services`` (``decide_interrupt``,
``reconcile_interrupt``, ``answer_interrupt``), which check that the item is
still pending (409). You see the items you may decide and those of runs you
may see (``Interrupt.objects.visible_to``, ``runs.access``); any other item
is 404 on every verb, like a missing one. On one you see, the permission
(``decidable_by``) is checked (403) before anything else about the item is
said. Claims (``approvals.claims``) inform, they lock nothing. Decisions and
claims honour ``Idempotency-Key`` (``config.idempotency``); the
list is cursor pages with the filters of ``approvals.api.filters``.
"""

from django.conf import settings
from django.db.models import F
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response

from approvals.claims import claim_interrupt, unclaim_interrupt
from approvals.api.filters import InterruptFilter
from approvals.models import Decision, Interrupt
from approvals.api.serializers import (
    ApproveSerializer,
    InterruptSerializer,
    ReconcileSerializer,
    RejectSerializer,
    RespondSerializer,
)
from approvals.web.downloads import answer_file_response
from approvals.selectors import answer_file_visible
from approvals.services import answer_interrupt, decide_interrupt, reconcile_interrupt
from config.api import VisibleRowsMixin
from config.idempotency import IdempotentPostMixin
from config.strict_json import StrictJSONParser
from runs.access import flag_decidable
from runs.base.errors import Forbidden, TooLarge

DECISION_RESPONSES = {
    200: InterruptSerializer,
    400: OpenApiResponse(description="Edited arguments do not match the tool's schema."),
    403: OpenApiResponse(description="You may not decide this item."),
    409: OpenApiResponse(description="The item is no longer pending (`details.status` is its current status), "
                                     "or an approval is past its expiry (code `expired`, `details.expires_at`)."),
}

CLAIM_RESPONSES = {
    200: InterruptSerializer,
    403: OpenApiResponse(description="You may not decide this item, or unclaim another person's claim."),
    409: OpenApiResponse(description="The item is not pending, or someone else claimed it (`details.claimed_by`)."),
}


class BoundedMultiPartParser(MultiPartParser):
    """``multipart/form-data`` for answers with a file; a body declared larger than
    ``TOLLGATE["REQUEST_BODY_MAX_BYTES"]`` (the file limit plus ``DATA_UPLOAD_MAX_MEMORY_SIZE``) is refused
    (413) before it is parsed, where no server refused it before (``config.body_limit``)."""

    def parse(self, stream, media_type=None, parser_context=None):
        request = parser_context["request"]
        limit = settings.TOLLGATE["REQUEST_BODY_MAX_BYTES"]
        declared = request.META.get("CONTENT_LENGTH") or "0"
        if declared.isdigit() and int(declared) > limit:
            raise TooLarge(f"Request body too large: the limit is {limit} bytes.", details={"limit_bytes": limit})
        return super().parse(stream, media_type, parser_context)


@extend_schema_view(
    list=extend_schema(summary="List inbox items visible to you, newest first"),
    retrieve=extend_schema(summary="One inbox item"),
)
class InterruptViewSet(IdempotentPostMixin, VisibleRowsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet):
    """Inbox items you may decide or whose run you may see, each saying whether you may decide it;
    filters in ``approvals.api.filters``."""

    serializer_class = InterruptSerializer
    queryset = Interrupt.objects.select_related("run", "tool_call", "resolved_by", "answer_file")
    filterset_class = InterruptFilter

    # The verbs on one item, each with the relations its service reads of the item before it locks it
    # and loads it whole (which the answer shows): a question's call, for its options and file rule; a
    # claim's run, for the decide rule's requester (``approvals.claims``).
    VERB_RELATIONS = {"approve": (), "reject": (), "reconcile": (), "claim": ("run",), "unclaim": ("run",),
                      "respond": ("tool_call",)}

    def get_queryset(self):
        """The visible items (``visible_rows``). For a verb: with their run's requester instead of the
        flag (``_decidable_item`` sets it) and only the relations the verb reads first."""
        if self.action not in self.VERB_RELATIONS or getattr(self, "swagger_fake_view", False):
            return super().get_queryset()
        rows = Interrupt.objects.visible_to(self.request.user).annotate(run_requester=F("run__requested_by"))
        related = self.VERB_RELATIONS[self.action]
        return rows.select_related(*related) if related else rows

    def visible_rows(self, queryset, user):
        """Items ``user`` may decide or whose run they may see, each with ``user_may_decide``."""
        return queryset.visible_to(user).with_decidable_flag(user)

    def _decidable_item(self) -> Interrupt:
        """The item of the URL if visible (else 404) and the user may decide it (else 403), flagged so
        (``runs.access.flag_decidable``: the service's ``can_decide`` takes the flag)."""
        interrupt = self.get_object()
        flag_decidable(self.request.user, interrupt, requested_by_id=interrupt.run_requester)
        if not interrupt.user_may_decide:
            raise Forbidden("You may not decide this item.")
        return interrupt

    def _item_response(self, interrupt: Interrupt) -> Response:
        """The item after a verb of the user's, who may decide it (``_decidable_item`` checked, and
        ``decidable_by`` does not depend on the status), so ``can_decide`` needs no query."""
        interrupt.user_may_decide = True
        return Response(self.get_serializer(interrupt).data)

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
        return self._item_response(interrupt)

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
        return self._item_response(interrupt)

    @extend_schema(summary="Claim the item: you are handling it (others may still decide it)", request=None,
                   responses=CLAIM_RESPONSES)
    @action(detail=True, methods=["post"])
    def claim(self, request, pk=None):
        """Claim the item (``approvals.claims.claim_interrupt``); claiming your own claim again changes nothing."""
        interrupt = claim_interrupt(interrupt=self._decidable_item(), user=request.user)
        return self._item_response(interrupt)

    @extend_schema(summary="Drop the claim on the item (its claimer, or staff)", request=None,
                   responses=CLAIM_RESPONSES)
    @action(detail=True, methods=["post"])
    def unclaim(self, request, pk=None):
        """Drop the claim (``approvals.claims.unclaim_interrupt``); an unclaimed item stays as it is."""
        interrupt = unclaim_interrupt(interrupt=self._decidable_item(), user=request.user)
        return self._item_response(interrupt)

    @extend_schema(summary="Answer a question (an input item); the answer is the ask_user call's result",
                   request={"application/json": RespondSerializer, "multipart/form-data": RespondSerializer},
                   responses={
                       **DECISION_RESPONSES,
                       400: OpenApiResponse(description="Empty answer, not one of the question's options, or a "
                                                        "file missing, not taken or of a refused type."),
                       403: OpenApiResponse(description="Only the run's requester or staff may answer."),
                       413: OpenApiResponse(description="The file (or the body) is over the size limit.")})
    @action(detail=True, methods=["post"], parser_classes=[StrictJSONParser, BoundedMultiPartParser])
    def respond(self, request, pk=None):
        """Answer an input item, with a file if the question allows one; the run resumes with the answer
        (and the file's metadata) as the tool result."""
        interrupt = self._decidable_item()
        body = RespondSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        interrupt = answer_interrupt(interrupt=interrupt, user=request.user, answer=body.validated_data["answer"],
                                     file=body.validated_data.get("file"))
        return self._item_response(interrupt)

    @extend_schema(summary="Download the file a question was answered with",
                   responses={(200, "*/*"): OpenApiTypes.BINARY,
                              404: OpenApiResponse(description="No such item, not one you may see, or no file.")})
    @action(detail=True, methods=["get"], url_path="file", filter_backends=[])
    def file(self, request, pk=None):
        """The item's answer file as an attachment (``nosniff``), for users who may see its run."""
        answer_file = answer_file_visible(user=request.user, interrupt_id=self.get_object().pk)
        if answer_file is None:
            raise Http404("No file.")
        return answer_file_response(answer_file)
