"""WebSocket URL map (mounted by ``config.asgi``)."""

from django.urls import path

from runs.consumers import RunConsumer, RunListConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]
