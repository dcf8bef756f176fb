"""Building blocks for the REST lists' query filters (django-filter ``FilterSet``s in each app's ``filters.py``).

Every value is checked by a form field before it reaches the database: a
value the field refuses (a word where an id goes, an id past 64 bits, a
NUL character, a malformed date-time) is a 400 in the error shape, naming
the parameter under ``details["fields"]``. Unknown parameters are ignored,
as django-filter does.
"""

from datetime import UTC, datetime

import django_filters as filters
from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django_filters.fields import IsoDateTimeField

from config.strict_json import MAX_INT


class IdFilter(filters.Filter):
    """An object id: a whole number from 1 to 2**63 - 1."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        super().__init__(*args, min_value=1, max_value=MAX_INT, **kwargs)


class SlugFilter(filters.CharFilter):
    """A slug (letters, digits, ``-`` and ``_``, at most 50 characters), e.g. an agent's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, max_length=50, validators=[validate_slug], **kwargs)


def in_utc(value: datetime) -> datetime:
    """``value`` in UTC; raises ``ValidationError`` for one that UTC cannot hold (e.g. year 9999 at -23:59)."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValidationError("This date-time is out of range.", code="invalid") from None


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, checked to fit in UTC (the database's clock)."""

    def to_python(self, value):
        parsed = super().to_python(value)
        return None if parsed is None else in_utc(parsed)


class DateTimeFilter(filters.IsoDateTimeFilter):
    """An ISO 8601 date-time filter whose value always converts to UTC (else a 400)."""

    field_class = UtcDateTimeField


class CreatedBetweenFilterSet(filters.FilterSet):
    """``created_after`` (inclusive) and ``created_before`` (exclusive): ISO 8601 date-times, e.g.
    ``2026-11-30T12:00:00Z`` (one without an offset is in UTC)."""

    created_after = DateTimeFilter(field_name="created_at", lookup_expr="gte",
                                              help_text="Created at or after this ISO 8601 date-time.")
    created_before = DateTimeFilter(field_name="created_at", lookup_expr="lt",
                                               help_text="Created before this ISO 8601 date-time.")
