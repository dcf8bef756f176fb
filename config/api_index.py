"""``GET /api/``: where an integrator starts, the API's collections and documents by name.

The answer is ``{"resources": {name: absolute URL}, "schema": URL, "docs": URL}``;
like the schema it is for authenticated clients (a token or a session).
"""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

# Collections by the names integrators use, and the URL name of each list.
RESOURCES = {
    "agents": "api:agent-list",
    "sessions": "api:session-list",
    "runs": "api:run-list",
    "interrupts": "api:interrupt-list",
    "tools": "api:tool-list",
    "events": "api:event-list",
    "webhooks": "api:webhook-list",
}


class ApiIndexView(APIView):
    """The API's root: absolute URLs of every collection, the OpenAPI schema and its docs page."""

    @extend_schema(summary="The API's collections and documents", responses=inline_serializer("ApiIndex", {
        "resources": serializers.DictField(child=serializers.URLField(), help_text="Collection URLs by name."),
        "schema": serializers.URLField(help_text="The OpenAPI 3 document."),
        "docs": serializers.URLField(help_text="The documentation page (Swagger UI) for people."),
    }))
    def get(self, request):
        return Response({
            "resources": {name: reverse(url_name, request=request) for name, url_name in RESOURCES.items()},
            "schema": reverse("schema", request=request),
            "docs": reverse("api-docs", request=request),
        })
