"""Inbox pages: the list of pending items and one item with its decision form.

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
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from approvals import selectors
from approvals.answer_files import file_rule
from approvals.downloads import answer_file_response
from approvals.forms import AnswerForm, DecisionForm, ReconcileForm
from approvals.models import InterruptKind, InterruptStatus
from approvals.services import answer_interrupt, decide_interrupt, question_options, reconcile_interrupt
from config.error_display import error_page, page_error
from runs.errors import TollgateError
from runs.labels import label
from runs.selectors import run_tool_calls, session_messages
from tools.registry import get_tool


@login_required
@require_GET
def inbox(request):
    """Pending items the user may decide, newest first; ``?assigned=me``: only those they claimed."""
    items = selectors.assigned_to(selectors.inbox_items(user=request.user), request.user, request.GET.get("assigned"))
    return render(request, "approvals/inbox.html", {"items": items})


@login_required
def interrupt_detail(request, interrupt_id: int):
    """One item: tool, arguments, the run's conversation and tool results; POST decides it.

    Approval items take approve / reject (``decide_interrupt``),
    reconciliation items succeeded / failed with evidence
    (``reconcile_interrupt``), input items an answer: free text, or one
    button per option (``answer_interrupt``).
    """
    item = selectors.interrupt_get_visible(user=request.user, interrupt_id=interrupt_id)
    if item is None:
        raise Http404("No such inbox item.")
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
                                  back_url=reverse("run-detail", args=[item.run_id]))
            except TollgateError as exc:
                field = "edited_arguments" if "edited_arguments" in form.fields else None
                response = page_error(request, exc, form=form, field=field, back_url=back_url)
                if response is not None:
                    return response
            else:
                return redirect("run-detail", run_id=item.run_id)
        status = 400
    tool = get_tool(tool_call.name) if tool_call else None
    return render(request, "approvals/interrupt_detail.html", {
        "item": item,
        "tool_call": tool_call,
        "tool": tool,
        "form": form,
        "can_decide": item.status == InterruptStatus.PENDING and item.user_may_decide,
        "options": question_options(item) if item.kind == InterruptKind.INPUT else [],
        "file_rule": file_rule(tool_call.arguments if tool_call else None),
        "file_max_bytes": settings.TOLLGATE["ANSWER_FILE_MAX_BYTES"],
        "answer_file": getattr(item, "answer_file", None),
        "messages_": session_messages(session_id=item.run.session_id),
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


def _already_decided(item) -> str:
    """The 409 page's message for an item someone resolved meanwhile, in the page's language."""
    if item.resolved_by:
        return _("This item is already %(status)s (%(decision)s by %(user)s); nothing was changed.") % {
            "status": label(item.status), "decision": label(item.decision), "user": item.resolved_by}
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
