"""Template filters and tags for the browser surfaces.

Filters here return plain strings: Django escapes them like any other
value, which is what model-produced text needs.
"""

import json

from django import template
from django.utils.html import json_script

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
def labels_script(element_id: str):
    """A ``<script type="application/json" id=element_id>`` holding every label in the page's language.

    The run page's script reads it to show live status changes in the
    page's language. A JSON data block is not executed, so the
    Content-Security-Policy's ban on inline scripts does not apply.
    """
    return json_script(labels.labels_in_active_language(), element_id)
