"""The inbox pages' shared lookup: an item the user may look at, or a 404.

Used by ``approvals.web.views`` (the item page, its live state) and
``approvals.web.workflow`` (claims), so "not yours to see" and "no such
item" answer alike everywhere: a 404 that tells nothing about the item.
"""

from django.http import Http404

from approvals import selectors
from approvals.models import Interrupt


def visible_item_or_404(request, interrupt_id: int) -> Interrupt:
    """Item ``interrupt_id`` if ``request.user`` may look at it (``selectors.interrupt_get_visible``,
    with ``user_may_decide`` set); raises ``Http404`` when it does not exist or is not theirs to see."""
    item = selectors.interrupt_get_visible(user=request.user, interrupt_id=interrupt_id)
    if item is None:
        raise Http404("No such inbox item.")
    return item
