"""The OpenAPI document's shared parts, and the page that shows it.

``document_errors_and_idempotency`` is a drf-spectacular postprocessing
hook (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``): it adds the one
error object (component ``Error``, the body ``config.api`` gives every
4xx) as the response of every error status each operation can answer, and
the ``Idempotency-Key`` header to every POST (``config.idempotency``).
A view's own description of a status (e.g. what a 409 means there) is kept.

``ApiDocsView`` serves Swagger UI at ``/api/docs/`` from the static files
of drf-spectacular-sidecar, its start-up script as a separate request, and
no inline script or style: it works under the site's Content-Security-Policy.
"""

from drf_spectacular.views import SpectacularSwaggerSplitView

from config.idempotency import IDEMPOTENCY_HEADER, KEY_MAX_LENGTH, REPLAYED_HEADER

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error answer (4xx) has this body.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": {"type": "string", "description": "Stable, for programs: e.g. invalid, not_found, "
                                                          "session_busy, illegal_transition, throttled."},
                "message": {"type": "string", "description": "For people."},
                "details": {"type": "object", "additionalProperties": True, "description": (
                    "More about it: `fields` (messages by field) for invalid input, `status` (the object's "
                    "current status) for a 409, `active_run` for session_busy, `retry_after` (seconds) for 429.")},
            },
        },
    },
}
ERROR_REF = {"$ref": "#/components/schemas/Error"}

# Statuses any operation may answer, then those only operations with a path id or a body add.
ANY_OPERATION = {
    "400": "Invalid query parameter or request (`details.fields`).",
    "401": "Not authenticated (no or a wrong token or session).",
    "403": "Not allowed.",
    "429": "Too many requests: see the `Retry-After` header.",
}
WITH_ID = {"404": "No such object, or not one you may see."}
WITH_BODY = {
    "409": "The object's state does not allow it now, or a request with this Idempotency-Key is still being handled.",
    "411": "The body came without a Content-Length (Transfer-Encoding: chunked is not accepted).",
    "413": "Request body too large.",
    "415": "Only application/json bodies, in a text charset (UTF-8), are accepted.",
    "422": "This Idempotency-Key was already used for a different request.",
}
IDEMPOTENCY_PARAMETER = {
    "in": "header",
    "name": IDEMPOTENCY_HEADER,
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": KEY_MAX_LENGTH, "pattern": "^[ -~]+$"},
    "description": (f"Your key for this request (printable ASCII). Sent again with the same body within 24 hours, "
                    f"the first answer is replayed (header `{REPLAYED_HEADER}: true`) and nothing is done twice; "
                    "with another body: 422. Keys are per user and per endpoint."),
}


def document_errors_and_idempotency(result, generator, request, public):
    """Postprocessing hook: the ``Error`` component on every error status, ``Idempotency-Key`` on every POST."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            statuses = {**ANY_OPERATION, **(WITH_ID if "{" in path else {}), **(WITH_BODY if method == "post" else {})}
            responses = operation.setdefault("responses", {})
            for status, description in statuses.items():
                responses.setdefault(status, {"description": description})
            for status, response in responses.items():
                if status.startswith("4"):
                    response["content"] = {"application/json": {"schema": ERROR_REF}}
            if method == "post":
                parameters = operation.setdefault("parameters", [])
                if not any(p.get("name") == IDEMPOTENCY_HEADER and p.get("in") == "header" for p in parameters):
                    parameters.append(IDEMPOTENCY_PARAMETER)
    return result


class ApiDocsView(SpectacularSwaggerSplitView):
    """Swagger UI for ``/api/schema/`` (logged-in users; ``config.urls`` sends others to the login page)."""

    template_name = "api/swagger_ui.html"
