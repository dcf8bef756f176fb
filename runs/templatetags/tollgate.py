"""Template filters for the browser surfaces.

Filters here return plain strings: Django escapes them like any other
value, which is what model-produced text needs.
"""

import json

from django import template

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
