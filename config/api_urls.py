"""REST API routes, mounted at ``/api/`` by ``config.urls``."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from approvals.api.items import InterruptViewSet
from config.api_index import ApiIndexView
from runs.api.runs import AgentViewSet, RunViewSet, SessionViewSet
from runs.api.waits import EventView, run_wait
from runs.webhooks.api import WebhookDeliveryViewSet, WebhookSubscriptionViewSet
from tools.api import ToolListView

router = SimpleRouter()
router.register("agents", AgentViewSet, basename="agent")
router.register("runs", RunViewSet, basename="run")
router.register("sessions", SessionViewSet, basename="session")
router.register("interrupts", InterruptViewSet, basename="interrupt")
router.register("webhooks/deliveries", WebhookDeliveryViewSet, basename="webhook-delivery")
router.register("webhooks", WebhookSubscriptionViewSet, basename="webhook")

urlpatterns = [
    path("", ApiIndexView.as_view(), name="index"),
    *router.urls,
    path("tools/", ToolListView.as_view(), name="tool-list"),
    path("events/", EventView.as_view(), name="event-list"),
    path("runs/<int:run_id>/wait/", run_wait, name="run-wait"),
]
