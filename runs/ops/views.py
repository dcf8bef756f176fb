"""The operators' endpoints: ``/healthz`` (the process answers), ``/readyz`` (it can do its work) and ``/metrics``.

Answered by ``runs.ops.middleware.ProbeMiddleware`` before any other
middleware; the probes are unauthenticated, uncached, and hold nothing sensitive;
``/metrics`` is closed unless configured (``runs.ops.metrics.access``).
"""

from django.http import HttpResponse, JsonResponse

from runs.ops import health, metrics


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


def prometheus_metrics(request) -> HttpResponse:
    """The Prometheus metrics (``runs.ops.metrics``): 404 when no ``TOLLGATE["METRICS_TOKEN"]`` is set, 401
    without ``Authorization: Bearer <token>``, else 200 in Prometheus's text format."""
    allowed = metrics.access(request.headers.get("Authorization", ""))
    if allowed == "closed":
        return HttpResponse(status=404)
    if allowed == "refused":
        response = HttpResponse(status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    response = HttpResponse(metrics.exposition(), content_type=metrics.CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
