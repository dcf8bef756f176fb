"""Run pages: list, detail (timeline), start, cancel, and a status JSON for polling.

Views are thin: load through ``runs.selectors`` (visibility is
``Run.objects.visible_to``), call the lifecycle services, render. Service
errors are shown by ``config.error_display``.
"""

from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from approvals.selectors import run_decided_interrupts, run_pending_interrupts
from config.error_display import error_page, page_error
from config.throttles import check_run_start_rate
from runs import selectors
from runs.web import explanations
from runs.access import RunAccess
from runs.engine.lifecycle import cancel_run_as, start_run
from runs.base.errors import Throttled, TollgateError
from runs.web.forms import StartRunForm
from runs.base.labels import label
from runs.live import run_snapshot
from runs.models import Run


def _visible_run_or_404(request, run_id: int):
    run = selectors.run_get_visible(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    return run


@login_required
@require_GET
def run_list(request):
    """Runs the user may see, newest first."""
    return render(request, "runs/run_list.html", {
        "runs": selectors.run_list(user=request.user),
        "sees_all": RunAccess.of(request.user).sees_all,
    })


@login_required
@require_GET
def run_detail(request, run_id: int):
    """One run: status fields, the outcome and the timeline told in the reader's language, the model's final text
    beside the facts contradicting it, tool calls, pending and decided inbox items, cancel."""
    run = _visible_run_or_404(request, run_id)
    return render(request, "runs/run_detail.html", {
        "run": run,
        "final_output": selectors.final_output_status(run),
        "outcome": explanations.outcome_explanation(run),
        "timeline": explanations.run_timeline(run=run),
        "tool_calls": selectors.run_tool_calls(run=run),
        "pending_items": run_pending_interrupts(run=run),
        "decided_items": run_decided_interrupts(run=run),
        "messages_": selectors.session_messages(session_id=run.session_id),
        "can_cancel": not run.is_terminal and Run.objects.cancellable_by(request.user).filter(pk=run.pk).exists(),
    })


@login_required
@require_GET
def run_status(request, run_id: int):
    """The run's live snapshot as JSON (the page polls it when the WebSocket is quiet)."""
    return JsonResponse({"run": run_snapshot(_visible_run_or_404(request, run_id))})


@login_required
@require_POST
def run_cancel(request, run_id: int):
    """Ask to cancel the run (``cancel_run_as``); 409 page when it already ended."""
    run = _visible_run_or_404(request, run_id)
    back_url = reverse("run-detail", args=[run.pk])
    try:
        cancel_run_as(run=run, user=request.user, reason="cancelled in the browser")
    except (TransitionNotAllowed, ConcurrentTransition):
        run.refresh_from_db()
        return error_page(request, status=409, title=_("Run already finished"),
                          message=_("Run %(run)s is %(status)s; it can no longer be cancelled.")
                          % {"run": run.pk, "status": label(run.status)}, back_url=back_url)
    except TollgateError as exc:
        return page_error(request, exc, back_url=back_url)
    return redirect("run-detail", run_id=run.pk)


@login_required
def run_start(request):
    """Form to start a run of an agent; on success go to the new run's page.

    Every POST counts against the user's ``runs`` rate, shared with
    ``POST /api/runs/``; over it, the form again with what was typed and the
    reason, 429 and ``Retry-After``.
    """
    form = StartRunForm(request.POST or None)
    if request.method == "POST":
        try:
            check_run_start_rate(request)
        except Throttled as exc:
            form.is_valid()  # the typed values are shown again, their own errors too
            form.add_error(None, exc.message)
            response = render(request, "runs/run_start.html", {"form": form}, status=exc.http_status)
            response["Retry-After"] = str(exc.details["retry_after"])
            return response
    if request.method == "POST" and form.is_valid():
        try:
            run = start_run(agent=form.cleaned_data["agent"], user=request.user, input=form.cleaned_data["input"])
        except TollgateError as exc:
            response = page_error(request, exc, form=form, back_url=reverse("run-start"))
            if response is not None:
                return response
        else:
            return redirect("run-detail", run_id=run.pk)
    status = 400 if request.method == "POST" else 200
    return render(request, "runs/run_start.html", {"form": form}, status=status)
