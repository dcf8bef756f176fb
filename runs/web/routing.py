"""WebSocket URL maps (mounted by ``config.asgi``).

``websocket_urlpatterns``: browsers (session cookie, same-origin handshakes
only). ``integrator_websocket_urlpatterns``: integrators (API token, any
origin), mounted under ``ws/api/``.
"""

from django.urls import path

from runs.web.consumers import RunConsumer, RunEventsConsumer, RunListConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]

integrator_websocket_urlpatterns = [
    path("runs/<int:run_id>/", RunEventsConsumer.as_asgi()),
]
