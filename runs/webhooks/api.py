"""REST API for webhooks: your subscriptions, their deliveries, sending one again.

Everyone manages their own subscriptions only; another user's
subscription or delivery answers 404 on every verb. The secret appears in
the answer to ``POST /api/webhooks/`` and nowhere else. Service errors
become HTTP answers in ``config.api.exception_handler`` (a refused URL is a
400 naming the reason under ``url``).
"""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from config.idempotency import IdempotentPostMixin
from runs.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookSubscription
from runs.webhooks.serializers import (
    RedeliverSerializer,
    WebhookDeliverySerializer,
    WebhookSubscriptionCreatedSerializer,
    WebhookSubscriptionSerializer,
    WebhookSubscriptionWriteSerializer,
)
from runs.webhooks.services import create_subscription, redeliver, update_subscription

WRITE_RESPONSES = {400: OpenApiResponse(description="A refused URL (`url`: why) or unknown event types.")}


@extend_schema_view(
    list=extend_schema(summary="List your webhook subscriptions"),
    retrieve=extend_schema(summary="One of your webhook subscriptions"),
    destroy=extend_schema(summary="Delete a subscription and its deliveries"),
)
class WebhookSubscriptionViewSet(IdempotentPostMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                                 mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your webhook subscriptions: create, read, change, delete, and their deliveries."""

    serializer_class = WebhookSubscriptionSerializer
    queryset = WebhookSubscription.objects.all()
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return self.queryset.none()
        return self.queryset.filter(owner=self.request.user)

    @extend_schema(summary="Subscribe an endpoint; the answer holds the signing secret, shown only this once",
                   request=WebhookSubscriptionWriteSerializer,
                   responses={201: WebhookSubscriptionCreatedSerializer, **WRITE_RESPONSES})
    def create(self, request):
        """Check the body's shape, then let ``create_subscription`` check the URL and save it."""
        body = WebhookSubscriptionWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        subscription = create_subscription(owner=request.user, **body.validated_data)
        return Response(WebhookSubscriptionCreatedSerializer(subscription).data, status=status.HTTP_201_CREATED)

    @extend_schema(summary="Change a subscription (any of url, event_types, active)",
                   request=WebhookSubscriptionWriteSerializer,
                   responses={200: WebhookSubscriptionSerializer, **WRITE_RESPONSES})
    def partial_update(self, request, pk=None):
        """Change the fields given; a new URL is checked like a new subscription's."""
        subscription = self.get_object()
        body = WebhookSubscriptionWriteSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        subscription = update_subscription(subscription, **body.validated_data)
        return Response(self.get_serializer(subscription).data)

    @extend_schema(summary="Deliveries of a subscription, newest first", parameters=[
        OpenApiParameter("status", OpenApiTypes.STR, enum=DeliveryStatus.values)],
        responses={200: WebhookDeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None):
        """The subscription's deliveries (paginated), optionally of one ``status``."""
        subscription = self.get_object()
        deliveries = subscription.deliveries.order_by("-id")
        wanted = request.query_params.get("status")
        if wanted is not None:
            if wanted not in DeliveryStatus.values:
                raise ValidationError({"status": f"Must be one of: {', '.join(DeliveryStatus.values)}."})
            deliveries = deliveries.filter(status=wanted)
        page = self.paginate_queryset(deliveries)
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)


@extend_schema_view(retrieve=extend_schema(summary="One delivery of your subscriptions"))
class WebhookDeliveryViewSet(IdempotentPostMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Deliveries of your subscriptions: read one, send it again."""

    serializer_class = WebhookDeliverySerializer
    queryset = WebhookDelivery.objects.select_related("subscription")
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset.none()
        return self.queryset.filter(subscription__owner=self.request.user)

    @extend_schema(summary="Send a delivery again, from the start of the retry schedule", request=RedeliverSerializer,
                   responses={202: WebhookDeliverySerializer,
                              409: OpenApiResponse(description="An attempt is under way, or the subscription "
                                                               "is inactive.")})
    @action(detail=True, methods=["post"])
    def redeliver(self, request, pk=None):
        """Queue the delivery again (``services.redeliver``); 202 with it, now pending."""
        delivery = self.get_object()
        RedeliverSerializer(data=request.data).is_valid(raise_exception=True)
        return Response(self.get_serializer(redeliver(delivery)).data, status=status.HTTP_202_ACCEPTED)
