"""REST API routes, mounted at ``/api/`` by ``config.urls``."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from approvals.api import InterruptViewSet
from runs.api import AgentViewSet, RunViewSet, SessionViewSet
from tools.api import ToolListView

router = SimpleRouter()
router.register("agents", AgentViewSet, basename="agent")
router.register("runs", RunViewSet, basename="run")
router.register("sessions", SessionViewSet, basename="session")
router.register("interrupts", InterruptViewSet, basename="interrupt")

urlpatterns = [
    *router.urls,
    path("tools/", ToolListView.as_view(), name="tool-list"),
]
