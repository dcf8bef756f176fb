"""Answer the operators' endpoints (``PROBES``) ahead of every other middleware.

Load balancers, orchestrators and Prometheus call a server by its address
(``http://10.0.3.7:8000/readyz``), over plain HTTP, with no session or
cookie, many times a minute. Behind the rest of the stack such a request
would be refused for its Host header (``ALLOWED_HOSTS``), redirected to
HTTPS (``SECURE_SSL_REDIRECT``), given a session, a language and a time
zone it does not need, or counted by a rate limit. So this middleware,
first in ``MIDDLEWARE``, answers those paths itself: their answers hold
no absolute URL and nothing that depends on the Host header, and
``/metrics`` checks its own bearer token (``runs.ops.metrics``). Only
GET and HEAD are answered; another method gets 405.
"""

from django.http import HttpResponseNotAllowed

from runs.ops import views

PROBES = {
    "/healthz": views.healthz,
    "/readyz": views.readyz,
    "/metrics": views.prometheus_metrics,
}


class ProbeMiddleware:
    """Django middleware: answers ``PROBES`` paths at once, passes everything else on."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        view = PROBES.get(request.path_info)
        if view is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        response = view(request)
        if request.method == "HEAD":
            response.content = b""
        return response
