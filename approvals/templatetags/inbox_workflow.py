"""Template filters of the inbox workflow pages."""

from django import template

from runs.access import groups_that_may_decide

register = template.Library()


@register.filter
def deciding_groups(interrupt) -> str:
    """The names of the Django groups whose members may decide ``interrupt``, comma-separated ("" for none)."""
    return ", ".join(groups_that_may_decide(interrupt).values_list("name", flat=True))
