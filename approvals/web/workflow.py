"""Inbox pages around the decisions: the history of decided items, claims, email preferences.

Thin like ``approvals.web.views``: read through ``approvals.selectors``, change
through ``approvals.claims`` and ``approvals.notifications.save_preferences``, render.
"""

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals import selectors
from approvals.claims import claim_interrupt, unclaim_interrupt
from approvals.web.forms import DecidedFilterForm, NotificationPreferenceForm
from approvals.web.lookups import visible_item_or_404
from approvals.notifications import preferences_of, save_preferences
from config.error_display import page_error, show_in_form
from runs.base.errors import InvalidInput, TollgateError


@login_required
@require_GET
def decided(request):
    """Decided items the user may see, newest decision first, filtered, a keyset page at a time
    (``selectors.decided_page``: "Previous" / "Next" links, the total counted up to ``COUNT_CAP``).

    A bad query string answers 400 with the form's errors and the first page, unfiltered.
    """
    form = DecidedFilterForm(request.GET)
    data = form.cleaned_data if form.is_valid() else {}
    day_from, day_to = data.get("day_from"), data.get("day_to")
    if data.get("when") == "today":
        day_from = day_to = timezone.localdate()
    filters = selectors.DecidedFilters(mine=data.get("who") == "me", decision=data.get("decision", ""),
                                       tool=data.get("tool", ""), day_from=day_from, day_to=day_to)
    page = selectors.decided_page(user=request.user, filters=filters, after=data.get("after"),
                                  before=data.get("before"))
    number = data.get("page") or 1
    return render(request, "approvals/decided.html", {
        "form": form, "page": page, "page_number": number, "count_cap": selectors.COUNT_CAP,
        "next_query": _page_query(request.GET, after=page.next_after, page=number + 1) if page.next_after else "",
        "previous_query": (_page_query(request.GET, before=page.previous_before, page=max(number - 1, 1))
                           if page.previous_before else ""),
    }, status=200 if form.is_valid() else 400)


def _page_query(query, **cursor) -> str:
    """``query`` (the page's query string) with its cursor replaced by ``cursor`` (``after`` or ``before``, ``page``)."""
    changed = query.copy()
    for key in ("after", "before", "page"):
        changed.pop(key, None)
    changed.update(cursor)
    return changed.urlencode()


@login_required
@require_POST
def claim(request, interrupt_id: int):
    """Claim (``action=claim``) or unclaim (``action=unclaim``) an item, then back to its page."""
    item = visible_item_or_404(request, interrupt_id)
    back_url = reverse("inbox-item", args=[interrupt_id])
    change = unclaim_interrupt if request.POST.get("action") == "unclaim" else claim_interrupt
    try:
        change(interrupt=item, user=request.user)
    except TollgateError as exc:
        return page_error(request, exc, back_url=back_url)
    return redirect(back_url)


@login_required
@require_http_methods(["GET", "POST"])
def notification_preferences(request):
    """The user's email preferences (all on until they change them), stored by ``notifications.save_preferences``."""
    form = NotificationPreferenceForm(request.POST or None, instance=preferences_of(request.user))
    if request.method == "POST" and form.is_valid():
        try:
            save_preferences(user=request.user, **form.cleaned_data)
        except InvalidInput as exc:
            show_in_form(form, exc)
        else:
            return redirect(reverse("notification-preferences") + "?saved=1")
    return render(request, "approvals/preferences.html", {"form": form, "saved": "saved" in request.GET},
                  status=400 if form.is_bound and not form.is_valid() else 200)

