"""Cursor pagination for every REST list: stable pages however many rows are added meanwhile.

A page is ``{"next": url | null, "previous": url | null, "results": [...]}``;
follow ``next`` to go on. ``?page_size=`` (1 to ``max_page_size``) sets the
page length, ``PAGE_SIZE`` (100) otherwise. A cursor or page size that is
not one this API made is a 400 in the error shape, never a 404 or a 500.
Built on DRF's ``CursorPagination`` (its docs: "Cursor Pagination"; the
idea is the one of Disqus's and Twitter's cursor APIs).
"""

from datetime import datetime

from django.core.exceptions import FieldDoesNotExist, ValidationError
from rest_framework.exceptions import NotFound
from rest_framework.exceptions import ValidationError as APIValidationError
from rest_framework.pagination import BasePagination, CursorPagination
from rest_framework.response import Response

from config.filters import in_utc


class NewestFirstCursorPagination(CursorPagination):
    """Newest first (``-created_at``, then ``-id`` among rows created in the same instant)."""

    ordering = ("-created_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 1000

    def paginate_queryset(self, queryset, request, view=None):
        self._model = queryset.model  # the cursor's position is checked against its ordering field
        return super().paginate_queryset(queryset, request, view)

    def get_page_size(self, request):
        """``?page_size=`` from 1 to ``max_page_size``; raises ``ValidationError`` (400) for anything else."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and 1 <= int(raw) <= self.max_page_size):
            raise APIValidationError({self.page_size_query_param: [
                f"Must be a whole number from 1 to {self.max_page_size}."]})
        return int(raw)

    def get_schema_operation_parameters(self, view):
        """DRF's two parameters, with the bounds of ``page_size`` and what a cursor is."""
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_page_size)
            elif parameter["name"] == self.cursor_query_param:
                parameter["description"] = "The cursor of the next or previous page, from a page's links."
        return parameters

    def decode_cursor(self, request):
        """DRF's decoding, plus a check that the position fits the ordering field; a bad cursor is a 400."""
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise self._invalid_cursor() from None
        if cursor is not None and cursor.position is not None:
            try:
                position = self._model._meta.get_field(self.ordering[0].lstrip("-")).clean(cursor.position, None)
                if isinstance(position, datetime):
                    in_utc(position)
            except (ValidationError, FieldDoesNotExist):
                raise self._invalid_cursor() from None
        return cursor

    def _invalid_cursor(self) -> APIValidationError:
        return APIValidationError({self.cursor_query_param: [
            "Invalid cursor: use the next or previous link of a page as it is."]})


class OldestFirstCursorPagination(NewestFirstCursorPagination):
    """Oldest first by ``id``: histories (a session's messages, a run's tool calls)."""

    ordering = ("id",)


class EventCursorPagination(NewestFirstCursorPagination):
    """A run's events, oldest first, in their ``seq`` order."""

    ordering = ("seq",)


class WholeListPagination(BasePagination):
    """For a short, fixed list (the tool registry): all of it as one page, in the same envelope
    (``next`` and ``previous`` always null), so clients read every list the same way."""

    def paginate_queryset(self, queryset, request, view=None):
        return list(queryset)

    def get_paginated_response(self, data):
        return Response({"next": None, "previous": None, "results": data})

    def get_paginated_response_schema(self, schema):
        return {"type": "object", "required": ["next", "previous", "results"], "properties": {
            "next": {"type": "string", "nullable": True, "description": "Always null: there is one page."},
            "previous": {"type": "string", "nullable": True, "description": "Always null."},
            "results": schema,
        }}
