"""The probe endpoints: ``/healthz`` (the process answers) and ``/readyz`` (it can do its work).

Answered by ``runs.ops.middleware.ProbeMiddleware`` before any other
middleware; unauthenticated, uncached, and with nothing sensitive in them.
"""

from django.http import JsonResponse

from runs.ops import health


def _answer(body: dict, status: int = 200) -> JsonResponse:
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response


def healthz(request) -> JsonResponse:
    """200 ``{"status": "alive"}``: the process serves requests. Touches nothing else (a liveness probe
    that failed with the database would restart every server when the database blinks)."""
    return _answer({"status": "alive"})


def readyz(request) -> JsonResponse:
    """200 ``{"status": "ready", "checks": {...}}`` when the database and the broker answer and the migrations
    are applied, else 503 ``{"status": "unavailable", "checks": {...}}`` (``runs.ops.health.readiness``)."""
    ready, checks = health.readiness()
    return _answer({"status": "ready" if ready else "unavailable", "checks": checks}, 200 if ready else 503)
