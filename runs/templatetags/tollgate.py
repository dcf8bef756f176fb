"""Template filters and tags for the browser surfaces.

Filters here return plain strings: Django escapes them like any other
value, which is what model-produced text needs.
"""

import json

from django import template

from runs import labels

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """``value`` as indented JSON; a string is parsed first, and shown verbatim if it is not JSON."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def label(value) -> str:
    """The page word for a status, phase, reason, kind or role (``runs.labels.label``), translated."""
    return labels.label(value)


@register.simple_tag
def labels_json() -> str:
    """Every label in the page's language as a JSON object ``{value: word}``, for an attribute.

    The run page's script reads it (``data-labels``) to show live status
    changes in the page's language; an attribute, not an inline script,
    which the Content-Security-Policy forbids. The string is not marked
    safe: the template escapes it like any attribute value.
    """
    return json.dumps(labels.labels_in_active_language(), ensure_ascii=False)
