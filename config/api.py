"""REST API error mapping shared by every app: one error object for every error answer.

Every 4xx body is ``{"error": {"code": str, "message": str, "details": {...}}}``
(``ERROR_SCHEMA`` in ``config.api_schema`` documents it). What maps to what:

* ``runs.base.errors.TollgateError`` (what services raise) -> its
  ``http_status``, ``code``, ``message`` and ``details``; the field
  messages of an ``InvalidInput`` go under ``details["fields"]``;
  ``SessionBusy`` keeps ``active_run`` in ``details``;
* ``TransitionNotAllowed`` / ``ConcurrentTransition`` -> 409
  ``illegal_transition`` with the object's current ``status`` in ``details``;
* DRF's own exceptions keep their status and code: ``ValidationError`` 400
  ``invalid`` (``details["fields"]``: messages by field, ``non_field_errors``
  for the body as a whole), ``ParseError`` 400, ``NotAuthenticated`` /
  ``AuthenticationFailed`` 401 (with ``WWW-Authenticate``; each counted
  against the address's ``anon`` rate, and over it a 429 instead), ``PermissionDenied``
  403, ``NotFound`` 404, ``MethodNotAllowed`` 405, ``UnsupportedMediaType``
  415, ``Throttled`` 429 (``Retry-After`` header, ``details["retry_after"]``
  in seconds);
* Django's ``PermissionDenied`` -> 403, ``Http404`` -> 404, ``ValidationError``
  (its validators) -> 400 ``invalid`` with ``details["fields"]``;
* ``RequestDataTooBig`` (body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``) -> 413
  ``too_large`` with ``details["limit_bytes"]``.

Anything else, a bare ``ValueError`` included, is a bug: a 500.

Errors Django answers itself, outside any API view (a path under ``/api/``
that matches no route, a 500, a ``SuspiciousOperation``), get the same
object from ``django_error_handler`` (``config.urls`` installs it as
``handler400`` ... ``handler500``); pages keep Django's own answers.

Also the visibility of rows (``VisibleRowsMixin``) and the serializer
bases every API app shares: ``StrictSerializer`` for
request bodies (unknown fields are a 400) and ``OutputSerializer`` for
what the API shows.
"""

import copy
import math

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, ValidationError
from django.http import Http404, JsonResponse
from django.views import defaults
from django_fsm import ConcurrentTransition, TransitionNotAllowed
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import set_rollback

from config.throttles import count_failed_authentication
from runs.access import RunAccess
from runs.base.errors import InvalidInput, Throttled, TollgateError


def error_body(code: str, message: str, details: dict | None = None) -> dict:
    """The one error object: ``{"error": {"code", "message", "details"}}``."""
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _first_message(messages) -> str:
    """The first message in a DRF error detail (a string, or lists and dicts of them, at any depth)."""
    stack = [messages]
    while stack:
        item = stack.pop(0)
        if isinstance(item, dict):
            stack[:0] = list(item.values())
        elif isinstance(item, (list, tuple)):
            stack[:0] = list(item)
        else:
            return str(item)
    return "Invalid input."


def _conflict(exc) -> Response:
    """409 for a transition the object's state does not allow, naming its current ``status`` when known."""
    obj = getattr(exc, "object", None)
    if obj is None:
        return Response(error_body("illegal_transition", "Changed by someone else meanwhile; reload and try again."),
                        status=status.HTTP_409_CONFLICT)
    obj.refresh_from_db()
    return Response(error_body("illegal_transition", f"Not allowed: this {obj._meta.verbose_name} is {obj.status}.",
                               {"status": obj.status}), status=status.HTTP_409_CONFLICT)


def _service_error(exc: TollgateError) -> Response:
    """A ``TollgateError``: its status, code, message and details (an ``InvalidInput``'s under ``fields``); a
    ``Throttled`` also says ``Retry-After``, as DRF's own throttles do."""
    details = {"fields": exc.details} if isinstance(exc, InvalidInput) and exc.details else exc.details
    retry_after = exc.details.get("retry_after") if isinstance(exc, Throttled) else None
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return Response(error_body(exc.code, exc.message, details), status=exc.http_status, headers=headers)


def _api_exception(exc: exceptions.APIException) -> Response:
    """One of DRF's exceptions, with the headers DRF would send (``WWW-Authenticate``, ``Retry-After``)."""
    headers = {}
    if auth_header := getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = auth_header
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {api_settings.NON_FIELD_ERRORS_KEY: exc.detail}
        body = error_body("invalid", _first_message(fields), {"fields": fields})
    elif isinstance(exc, exceptions.Throttled):
        wait = max(1, math.ceil(exc.wait or 1))
        headers["Retry-After"] = str(wait)
        body = error_body("throttled", f"Too many requests; try again in {wait} seconds.", {"retry_after": wait})
    else:
        code = getattr(exc.detail, "code", None) or exc.default_code
        body = error_body(code, str(exc.detail))
    return Response(body, status=exc.status_code, headers=headers)


def exception_handler(exc, context):
    """DRF exception handler: every known exception to the one error object (see module doc); else None (500)."""
    if isinstance(exc, (TransitionNotAllowed, ConcurrentTransition)):
        response = _conflict(exc)
    elif isinstance(exc, TollgateError):
        response = _service_error(exc)
    elif isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        response = Response(error_body("too_large", f"Request body too large: the limit is {limit} bytes.",
                                       {"limit_bytes": limit}), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    elif isinstance(exc, ValidationError):
        fields = exc.message_dict if hasattr(exc, "error_dict") else {api_settings.NON_FIELD_ERRORS_KEY: exc.messages}
        response = Response(error_body("invalid", _first_message(fields), {"fields": fields}),
                            status=status.HTTP_400_BAD_REQUEST)
    elif isinstance(exc, Http404):
        response = _api_exception(exceptions.NotFound())
    elif isinstance(exc, PermissionDenied):
        response = _api_exception(exceptions.PermissionDenied(*exc.args))
    elif isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        # DRF answers these before its throttles run: count them against the address's anonymous rate here.
        wait = count_failed_authentication(context["request"])
        response = _api_exception(exc if wait is None else exceptions.Throttled(wait))
    elif isinstance(exc, exceptions.APIException):
        response = _api_exception(exc)
    else:
        return None
    set_rollback()
    return response


API_PREFIX = "/api/"
# Django's handler for each status, and the API's code and message for it.
_DJANGO_ERRORS = {
    400: (defaults.bad_request, "bad_request", "Bad request."),
    403: (defaults.permission_denied, "permission_denied", "You do not have permission to perform this action."),
    404: (defaults.page_not_found, "not_found", "Not found."),
    500: (defaults.server_error, "server_error", "Internal server error."),
}


def django_error_handler(status_code: int):
    """A view for ``config.urls``'s ``handler<status_code>`` (400, 403, 404 or 500): errors Django answers
    outside DRF, in the API's shape.

    Under ``/api/`` the body is ``error_body(code, message)``, saying
    nothing of the exception (it may be a bug's); elsewhere Django's default
    view (``django.views.defaults``) answers with the site's templates.
    """
    page_view, code, message = _DJANGO_ERRORS[status_code]

    def handler(request, exception=None):
        if request.path_info.startswith(API_PREFIX):
            return JsonResponse(error_body(code, message), status=status_code)
        return page_view(request) if exception is None else page_view(request, exception)

    handler.__name__ = f"handler{status_code}"
    return handler


class VisibleRowsMixin:
    """For API viewsets: ``queryset`` narrowed to what the user may see (``runs.access.RunAccess``).

    Staff and approvers see every row; anyone else the rows whose
    ``owner_field`` (e.g. ``requested_by``, ``owner``) is them. A viewset
    whose rows follow another rule overrides ``visible_rows``. Schema
    generation (no user) gets none.
    """

    owner_field: str = ""

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset.none()
        return self.visible_rows(self.queryset, self.request.user)

    def visible_rows(self, queryset, user):
        """``queryset`` narrowed to the rows ``user`` may see."""
        return RunAccess.of(user).filter(queryset, owner_field=self.owner_field)

    def filter_queryset(self, queryset):
        """The filter backends narrow lists only: an item (``/<id>/`` and its actions) is found by its id.

        DRF applies them in ``get_object`` too, which built the list's whole
        filter set for every item request (and let a list parameter hide an item).
        """
        return queryset if getattr(self, "detail", False) else super().filter_queryset(queryset)


class OutputSerializer(serializers.ModelSerializer):
    """A read-only model serializer that keeps ``allow_blank`` (DRF drops it for ``read_only_fields``), so drf-spectacular
    documents a blank choice (a run's ``waiting_reason``) the field really shows.

    Its fields are built from the model once per class and cloned for each serializer, as DRF clones
    a plain serializer's declared fields (``copy.deepcopy``: each field made again from the arguments
    it was made with). DRF builds a model serializer's fields anew for every one: most of the CPU of
    serializing one object. So the fields of a subclass follow from its class alone, never from the
    serializer's instance or context.
    """

    _fields_by_class: dict[type, dict] = {}

    def get_fields(self):
        """The class's fields (``ModelSerializer.get_fields``, built on first use), cloned."""
        built = OutputSerializer._fields_by_class.get(type(self))
        if built is None:
            built = OutputSerializer._fields_by_class[type(self)] = super().get_fields()
        return copy.deepcopy(built)

    def include_extra_kwargs(self, kwargs, extra_kwargs):
        allow_blank = kwargs.get("allow_blank", False)
        kwargs = super().include_extra_kwargs(kwargs, extra_kwargs)
        if allow_blank:
            kwargs["allow_blank"] = True
        return kwargs


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
