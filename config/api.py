"""REST API error mapping shared by every app.

* ``TransitionNotAllowed`` / ``ConcurrentTransition`` -> 409 with the
  object's current status;
* ``django.core.exceptions.PermissionDenied`` -> 403;
* ``django.core.exceptions.ValidationError`` and ``ValueError`` raised by
  services -> 400;
* ``runs.services.SessionBusy`` -> 409 naming the active run;
* ``RequestDataTooBig`` (body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``) -> 413.
"""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, ValidationError
from django_fsm import ConcurrentTransition, TransitionNotAllowed
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from runs.services import SessionBusy


def _conflict(exc) -> dict:
    """The 409 body: what is not allowed, and the object's current ``status`` when known."""
    obj = getattr(exc, "object", None)
    if obj is None:
        return {"detail": "Changed by someone else meanwhile; reload and try again.", "code": "illegal_transition"}
    obj.refresh_from_db()
    name = obj._meta.verbose_name
    return {"detail": f"Not allowed: this {name} is {obj.status}.", "code": "illegal_transition", "status": obj.status}


def exception_handler(exc, context):
    """DRF exception handler: service exceptions to HTTP answers (see module doc)."""
    if isinstance(exc, (TransitionNotAllowed, ConcurrentTransition)):
        return Response(_conflict(exc), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, SessionBusy):
        return Response({"detail": str(exc), "code": "session_busy", "active_run": exc.active_run.pk},
                        status=status.HTTP_409_CONFLICT)
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response({"detail": f"Request body too large: the limit is {limit} bytes.", "code": "too_large"},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, ValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        return Response(detail, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ValueError):
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
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
