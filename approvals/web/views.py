"""Inbox pages: the list of pending items (and its rows, for live patching) and one item with its decision form.

Views are thin: load through ``approvals.selectors`` (who sees and
decides what is ``runs.access``), call ``approvals.services``
(``decide_interrupt``, ``reconcile_interrupt``, ``answer_interrupt``,
which check the permission), render. Their errors are shown by
``config.error_display`` (``Forbidden``: the 403 page, bad input: on the
form); deciding an item that is no longer pending renders the 409 page.
"""

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from approvals import selectors
from approvals.answer_files import file_rule
from approvals.web.downloads import answer_file_response
from approvals.web.forms import AnswerForm, DecisionForm, InboxFilterForm, ReconcileForm
from approvals.web.lookups import visible_item_or_404
from approvals.models import InterruptKind, InterruptStatus
from approvals.services import answer_interrupt, decide_interrupt, question_options, reconcile_interrupt
from config.error_display import error_page, page_error
from runs.base.errors import TollgateError
from runs.base.labels import label
from runs.selectors import run_tool_calls, session_messages
from tools.registry import get_tool, offered_tools
from tools.services.summary import describe


@login_required
@require_GET
def home(request):
    """``/`` and where a login lands: the inbox for those who decide (staff, holders of the decide
    permission) or have an item waiting for them (a question), else the run list."""
    return redirect("inbox" if selectors.lands_on_inbox(request.user) else "run-list")


@login_required
@require_GET
def inbox(request):
    """Pending items the user may decide, one page (``selectors.inbox_page``), sorted and filtered by the query.

    A bad query string answers 400 with the form's errors and no rows.
    """
    form = _filter_form(request.GET)
    if not form.is_valid():
        return render(request, "approvals/inbox.html", {"form": form, "page": selectors.InboxPage()}, status=400)
    data = form.cleaned_data
    filters = _filters(data)
    page = selectors.inbox_page(user=request.user, filters=filters, after=data["after"])
    number = data["page"] or 1
    following = request.GET.copy()
    following["after"], following["page"] = page.next_after, number + 1
    first = request.GET.copy()
    for key in ("after", "page"):
        first.pop(key, None)
    return render(request, "approvals/inbox.html", {
        "form": form, "page": page, "page_number": number, "sort": filters.sort,
        "next_query": following.urlencode() if page.next_after else "", "first_query": first.urlencode(),
        "scan_window": selectors.SCAN_WINDOW,
    })


@login_required
@require_GET
def inbox_rows(request):
    """The rows of the pending items of runs ``?run=<id>`` (up to 100) as the inbox shows them, for live patching.

    Takes the inbox's own sort and filters, so a row that no longer matches
    is left out (the page removes it). Only items the user may decide
    (``Interrupt.objects.decidable_by``) are rendered; another user's run
    gives no row. Also renders the navigation counts. Bad ids: 400.
    """
    form = _filter_form(request.GET)
    run_ids = request.GET.getlist("run")
    if not form.is_valid() or not 0 < len(run_ids) <= MAX_ROWS or not all(i.isascii() and i.isdigit() and len(i) < 19 for i in run_ids):
        return HttpResponseBadRequest(_("Give 1 to 100 run ids (?run=<id>) and a valid inbox query."))
    filters = _filters(form.cleaned_data)
    rows = selectors.rows_of_runs(user=request.user, run_ids=[int(i) for i in run_ids], filters=filters)
    return render(request, "approvals/_inbox_rows.html", {"rows": rows, "sort": filters.sort})


MAX_ROWS = 100  # run ids one fragment request may name


def _filter_form(data) -> InboxFilterForm:
    return InboxFilterForm(data, kinds=[(kind, label(kind)) for kind in InterruptKind.values],
                           tools=[tool.name for tool in offered_tools()], agents=selectors.agent_slugs())


def _filters(data: dict) -> selectors.InboxFilters:
    return selectors.InboxFilters(sort=data["sort"] or "expiry", kind=data["kind"], tool=data["tool"],
                                  agent=data["agent"], requester=data["requester"].strip(),
                                  search=data["q"].strip(), assigned=data["assigned"])


@login_required
def interrupt_detail(request, interrupt_id: int):
    """One item: what is asked and why, the call's arguments, earlier calls; POST decides it.

    Approval items take approve / reject (``decide_interrupt``),
    reconciliation items succeeded / failed with evidence
    (``reconcile_interrupt``), input items an answer: free text, or one
    button per option (``answer_interrupt``). The page listens on the
    run's WebSocket and swaps the form for ``interrupt_state`` once the
    item is decided elsewhere.
    """
    item = visible_item_or_404(request, interrupt_id)
    tool_call = item.tool_call
    data = request.POST if request.method == "POST" else None
    if item.kind == InterruptKind.RECONCILIATION:
        form = ReconcileForm(data)
    elif item.kind == InterruptKind.INPUT:
        form = AnswerForm(data, request.FILES if data is not None else None)
    else:
        original = tool_call.arguments if tool_call else None
        initial = {"edited_arguments": json.dumps(original, indent=2, ensure_ascii=False)} if original is not None else {}
        form = DecisionForm(data, initial=initial, original_arguments=original)
    status = 200
    if request.method == "POST":
        back_url = reverse("inbox-item", args=[item.pk])
        if form.is_valid():
            try:
                _decide(item, request.user, form)
            except (TransitionNotAllowed, ConcurrentTransition):
                item.refresh_from_db()
                return error_page(request, status=409, title=_("Already decided"), message=_already_decided(item),
                                  back_url=reverse("run-detail", args=[item.run_id]),
                                  detail=render_to_string("approvals/_item_state.html", {"item": item}, request))
            except TollgateError as exc:
                field = "edited_arguments" if "edited_arguments" in form.fields else None
                response = page_error(request, exc, form=form, field=field, back_url=back_url)
                if response is not None:
                    return response
            else:
                return redirect("run-detail", run_id=item.run_id)
        status = 400
    messages_ = list(session_messages(session_id=item.run.session_id))
    return render(request, "approvals/interrupt_detail.html", {
        "item": item,
        "tool_call": tool_call,
        "tool": get_tool(tool_call.name) if tool_call else None,
        "form": form,
        "can_decide": item.status == InterruptStatus.PENDING and item.user_may_decide,
        "options": question_options(item) if item.kind == InterruptKind.INPUT else [],
        "file_rule": file_rule(tool_call.arguments if tool_call else None),
        "file_max_bytes": settings.TOLLGATE["ANSWER_FILE_MAX_BYTES"],
        "summary": describe(tool_call) if tool_call and item.kind != InterruptKind.INPUT else None,
        "why": selectors.interrupt_why(item, messages_),
        "lookup": selectors.reconciliation_lookup(item),
        "messages_": messages_,
        "prior_calls": [c for c in run_tool_calls(run=item.run) if tool_call is None or c.pk != tool_call.pk],
    }, status=status)


@login_required
@require_GET
def answer_file_download(request, interrupt_id: int):
    """The file an item was answered with, as an attachment, for users who may see its run (else 404)."""
    answer_file = selectors.answer_file_visible(user=request.user, interrupt_id=interrupt_id)
    if answer_file is None:
        raise Http404("No such file.")
    return answer_file_response(answer_file)


@login_required
@require_GET
def interrupt_state(request, interrupt_id: int):
    """The item's state as a small fragment for its page's live update: who decided, when, their comment."""
    return render(request, "approvals/_item_state.html", {"item": visible_item_or_404(request, interrupt_id)})


def _already_decided(item) -> str:
    """The 409 page's message for an item someone resolved meanwhile, in the page's language.

    Who decided, when and with what comment follow it (``approvals/_item_state.html``).
    """
    return _("This item is already %(status)s; nothing was changed.") % {"status": label(item.status)}


def _decide(item, user, form) -> None:
    """Call the service that resolves ``item`` with the validated ``form``."""
    if item.kind == InterruptKind.INPUT:
        answer_interrupt(interrupt=item, user=user, answer=form.cleaned_data["answer"], file=form.cleaned_data["file"])
    elif item.kind == InterruptKind.RECONCILIATION:
        reconcile_interrupt(interrupt=item, user=user, succeeded=form.cleaned_data["outcome"] == "succeeded",
                            evidence=form.cleaned_data["evidence"], result=form.cleaned_data["result"])
    else:
        decide_interrupt(interrupt=item, user=user, decision=form.cleaned_data["decision"],
                         comment=form.cleaned_data["comment"], edited_arguments=form.cleaned_data["parsed_arguments"])
