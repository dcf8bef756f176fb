"""REST API error mapping shared by every app.

* ``runs.errors.TollgateError`` (what services raise) -> its
  ``http_status``: ``InvalidInput`` 400 (messages by field, or
  ``{"detail", "code"}``), ``Forbidden`` 403, ``Conflict`` 409 (e.g.
  ``session_busy`` naming the ``active_run``);
* ``TransitionNotAllowed`` / ``ConcurrentTransition`` -> 409 with the
  object's current status;
* ``django.core.exceptions.PermissionDenied`` -> 403 and Django's
  ``ValidationError`` (its validators) -> 400;
* ``RequestDataTooBig`` (body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``) -> 413.

Anything else, a bare ``ValueError`` included, is a bug: a 500.

Also the request-side helpers every API view shares: ``StrictSerializer``
(unknown fields are a 400), ``BoundedLimitOffsetPagination`` and
``int_query_param`` (integer query parameters with bounds).
"""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, ValidationError
from django_fsm import ConcurrentTransition, TransitionNotAllowed
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError as APIValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from runs.errors import InvalidInput, TollgateError


def _conflict(exc) -> dict:
    """The 409 body: what is not allowed, and the object's current ``status`` when known."""
    obj = getattr(exc, "object", None)
    if obj is None:
        return {"detail": "Changed by someone else meanwhile; reload and try again.", "code": "illegal_transition"}
    obj.refresh_from_db()
    name = obj._meta.verbose_name
    return {"detail": f"Not allowed: this {name} is {obj.status}.", "code": "illegal_transition", "status": obj.status}


def _error_body(exc: TollgateError) -> dict:
    """The body for a service error: messages by field for ``InvalidInput`` about fields, else
    ``{"detail", "code", **details}``."""
    if isinstance(exc, InvalidInput) and exc.details:
        return exc.details
    return {"detail": exc.message, "code": exc.code, **exc.details}


def exception_handler(exc, context):
    """DRF exception handler: service exceptions to HTTP answers (see module doc)."""
    if isinstance(exc, (TransitionNotAllowed, ConcurrentTransition)):
        return Response(_conflict(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, TollgateError):
        return Response(_error_body(exc), status=exc.http_status)
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response({"detail": f"Request body too large: the limit is {limit} bytes.", "code": "too_large"},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, ValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        return Response(detail, status=status.HTTP_400_BAD_REQUEST)
    return drf_exception_handler(exc, context)


class StrictSerializer(serializers.Serializer):
    """A request body that refuses fields it does not know (400), so a misspelt field is never ignored.

    Used where ignoring one would change a decision, e.g. edited arguments
    sent under the wrong name would approve the model's own arguments.
    """

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=&offset=`` pages of at most ``max_limit`` items; a larger limit is clamped to it.

    (An offset past the end is an empty page without a query, whatever its size.)
    """

    max_limit = 1000


def int_query_param(request, name: str, *, min_value: int = 1, max_value: int = 2**63 - 1) -> int | None:
    """The query parameter ``name`` as an int from ``min_value`` to ``max_value``, or None when absent.

    Only ASCII digits (with an optional leading minus) are read, and at
    most 19 of them. Raises DRF's ``ValidationError`` (400) naming the
    parameter otherwise.
    """
    raw = request.query_params.get(name)
    if raw is None:
        return None
    digits = raw.removeprefix("-")
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 19) or not min_value <= int(raw) <= max_value:
        raise APIValidationError({name: f"Must be a whole number from {min_value} to {max_value}."})
    return int(raw)
