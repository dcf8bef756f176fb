"""Bulk decisions in the inbox: a confirmation page, then one result page (``approvals.bulk``).

GET ``/inbox/bulk/?item=1&item=2``: the confirmation page lists what will
be decided (each item's tool and arguments, with its fingerprint in the
form) and what was left out. POST decides through ``approvals.bulk.decide_bulk``
and shows, per item, decided or skipped and why, and for the decided ones
what became of them: the run's and the call's status, and why a call was
denied. GET ``/inbox/bulk/outcomes/?item=1&item=2`` renders that table
again; the result page re-fetches it until every item has settled.
"""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from approvals.bulk import decide_bulk, plan_bulk
from approvals.selectors import conflicting, decorate_rows, item_outcomes
from approvals.web.forms import BulkDecisionForm
from config.error_display import page_error, show_in_form
from runs.base.errors import InvalidInput, TollgateError


@login_required
@require_http_methods(["GET", "POST"])
def inbox_bulk(request):
    """The confirmation page (GET ``item`` ids, or a POST to correct) and the result page (a valid POST).

    Bad ids, items of several tools: the 400 page. A missing comment: the
    confirmation page again (400), with the fingerprints it showed first.
    """
    form = BulkDecisionForm(request.POST if request.method == "POST" else None)
    ids = request.POST.getlist("item") if request.method == "POST" else request.GET.getlist("item")
    try:
        if form.is_bound and form.is_valid():
            try:
                outcomes = decide_bulk(user=request.user, decision=form.cleaned_data["decision"],
                                       comment=form.cleaned_data["comment"], expected=form.expected())
            except InvalidInput as exc:
                if "comment" not in exc.details:
                    raise
                show_in_form(form, exc)
            else:
                decided = [o for o in outcomes if o.decided]
                return render(request, "approvals/bulk_result.html", {
                    "decision": form.cleaned_data["decision"], "outcomes": outcomes, "decided": decided,
                    "skipped": [o for o in outcomes if not o.decided],
                    "results": item_outcomes(user=request.user, ids=[o.interrupt_id for o in decided])
                    if decided else []})
        plan = plan_bulk(user=request.user, ids=ids, shown=form.expected())  # a POST shown again keeps them
    except TollgateError as exc:
        return page_error(request, exc, back_url=reverse("inbox"))
    decorate_rows(plan.items, user=request.user)  # as the inbox shows them: "not all can be paid", item by item
    return render(request, "approvals/bulk_confirm.html", {"plan": plan, "form": form,
                                                           "conflicts": conflicting(plan.items)},
                  status=400 if form.is_bound else 200)



@login_required
@require_GET
def inbox_bulk_outcomes(request):
    """``?item=<id>``...: the result page's table of what became of those items now, for live updates.

    Only items the user may see are listed; bad ids: the 400 page.
    """
    try:
        results = item_outcomes(user=request.user, ids=request.GET.getlist("item"))
    except TollgateError as exc:
        return page_error(request, exc, back_url=reverse("inbox"))
    return render(request, "approvals/_bulk_outcomes.html", {"results": results})
