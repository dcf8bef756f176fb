"""Template filters and tags for the browser surfaces.

Filters here return plain strings: Django escapes them like any other
value, which is what model-produced text needs. The ones that show stored
JSON or text (``pretty_json``, ``json_value``, ``argument_fields``) also
make it printable: a lone surrogate (which no UTF-8 page can hold) shows as
U+FFFD, and text nested too deep to parse is shown as it is stored.
"""

import json

from django import template
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timesince import timeuntil
from django.utils.translation import gettext as _

from runs.base import labels
from config import strict_json

register = template.Library()


MAX_SHOWN_CHARS = 20_000  # of one stored text on a page; the API has it whole


def printable(text: str) -> str:
    """``text`` for a page: every lone surrogate replaced by U+FFFD (so the page can be encoded as UTF-8),
    and cut after ``MAX_SHOWN_CHARS`` with a note of how much more there is (text stored before the model
    output limit, ``TOLLGATE["MAX_MODEL_TEXT_CHARS"]``, may be megabytes long)."""
    if len(text) > MAX_SHOWN_CHARS:
        more = len(text) - MAX_SHOWN_CHARS
        text = text[:MAX_SHOWN_CHARS] + "… " + _("(%(count)s more characters)") % {"count": more}
    return strict_json.printable(text)


@register.filter
def shown_text(value) -> str:
    """Stored text (a message, raw arguments, the model's final words) as a page shows it: ``printable``."""
    return printable(str(value))


@register.filter
def pretty_json(value) -> str:
    """``value`` as indented JSON; a string is parsed first, and shown verbatim if it is not JSON (or is
    nested too deep to parse)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return printable(value)
    try:
        return printable(json.dumps(value, indent=2, ensure_ascii=False, default=str))
    except RecursionError:
        return printable(str(value)[:MAX_SHOWN_CHARS])


@register.filter
def label(value) -> str:
    """The page word for a status, phase, reason, kind or role (``runs.base.labels.label``), translated."""
    return labels.label(value)


@register.simple_tag
def labels_json() -> str:
    """Every label in the page's language as a JSON object ``{value: word}``, for the run page's
    ``data-labels`` attribute (the Content-Security-Policy forbids an inline script); not marked safe:
    the template escapes it like any attribute value."""
    return json.dumps(labels.labels_in_active_language(), ensure_ascii=False)


@register.filter
def json_value(value) -> str:
    """One value for people: a string as it is, anything else as compact JSON (``60``, ``true``, ``{"a": 1}``)."""
    if isinstance(value, str):
        return printable(value)
    try:
        return printable(json.dumps(value, ensure_ascii=False, default=str))
    except RecursionError:
        return printable(str(value)[:MAX_SHOWN_CHARS])


@register.filter
def argument_fields(arguments) -> list[dict]:
    """A call's top-level arguments as ``[{"name", "value", "text"}]`` (``[]`` if not a dict); ``text``: a string, shown as
    text with its line breaks, else JSON.
    """
    if not isinstance(arguments, dict):
        return []
    return [{"name": printable(str(name)), "value": printable(value) if isinstance(value, str) else value,
             "text": isinstance(value, str)} for name, value in arguments.items()]


@register.simple_tag
def expiry(expires_at) -> str:
    """When an inbox item expires, for people: "expires in 2 days" (exact time, in the page's time zone,
    on hover), "expiry passed" for a past time, "does not expire" without one (reconciliation items)."""
    if expires_at is None:
        return format_html('<span class="expiry never">{}</span>', _("does not expire"))
    exact = date_format(timezone.localtime(expires_at), "Y-m-d H:i:s") + " " + timezone.get_current_timezone_name()
    if expires_at <= timezone.now():
        words = _("expiry passed")
    else:
        words = _("expires in %(left)s") % {"left": timeuntil(expires_at)}
    return format_html('<span class="expiry" title="{}"><time datetime="{}">{}</time></span>', exact,
                       expires_at.isoformat(), words)
