"""Django admin for the inbox (docs/design.md#surfaces).

Inbox items are view-only; "Approve" and "Reject" are admin actions that
show a confirmation page with a comment, then decide each item through
``approvals.bulk`` (``decide_interrupt`` per item: the item's permission and
the requester rule, the tool call resolved, the run resumed), skipping and
reporting any item that changed meanwhile. Answer files are view-only too:
their metadata, and a link to the download that checks who may see the run.
"""

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _, gettext_lazy, ngettext

from approvals.bulk import CHANGED, GONE, NOT_PENDING, RUN_ENDED, decide_bulk, plan_bulk
from approvals.web.forms import BulkDecisionForm
from approvals.models import AnswerFile, Decision, Interrupt
from config.error_display import admin_error
from runs.admin import ReadOnlyAdminMixin
from runs.admin.base import AgentSlugFilter
from runs.base.errors import Forbidden, InvalidInput, TollgateError
from runs.base.labels import label


@admin.register(Interrupt)
class InterruptAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Inbox items, view-only; approve or reject them with the actions.

    The actions are offered to everyone who may see the list: whether a
    user may decide a given item is ``decide_interrupt``'s call (its
    ``required_permission`` and ``allow_requester``), and a refusal is
    reported per item.
    """

    list_display = (
        "id", "kind", "status", "shown_title", "run", "tool_call", "requested_by", "decision", "resolved_by",
        "claimed_by", "created_at", "expires_at",
    )
    list_filter = ("kind", "status", "decision", "required_permission", ("run__agent__slug", AgentSlugFilter))
    search_fields = ("=id", "=run__id", "title", "comment", "required_permission", "run__requested_by__username")
    list_select_related = ("run__requested_by", "tool_call", "resolved_by", "claimed_by")
    date_hierarchy = "created_at"
    actions = ["approve_selected", "reject_selected"]

    exclude = ("title",)  # the stored English title: shown as a person reads it instead (shown_title)

    def get_readonly_fields(self, request, obj=None):
        """Every field, read-only, the stored ``title`` shown as a person reads it (``shown_title``)."""
        return tuple("shown_title" if name == "title" else name for name in super().get_readonly_fields(request, obj))

    @admin.display(description=gettext_lazy("title"))
    def shown_title(self, interrupt: Interrupt) -> str:
        """The item's title in the admin's language, from its call (``Interrupt.display_title``)."""
        return interrupt.display_title

    @admin.display(description=gettext_lazy("requested by"), ordering="run__requested_by__username")
    def requested_by(self, interrupt: Interrupt):
        return interrupt.run.requested_by

    @admin.action(description=gettext_lazy("Approve selected items"))
    def approve_selected(self, request, queryset):
        """Approve the selected items after a confirmation page with a comment (``approvals.bulk``)."""
        return self._decide(request, queryset, Decision.APPROVED)

    @admin.action(description=gettext_lazy("Reject selected items"))
    def reject_selected(self, request, queryset):
        """Reject the selected items after a confirmation page with a comment (``approvals.bulk``)."""
        return self._decide(request, queryset, Decision.REJECTED)

    def _decide(self, request, queryset, decision: str):
        """First the confirmation page (``plan_bulk``); its POST (``confirm``) decides via ``decide_bulk``."""
        action = "approve_selected" if decision == Decision.APPROVED else "reject_selected"
        form = BulkDecisionForm(request.POST if "confirm" in request.POST else None, initial={"decision": decision})
        try:
            if form.is_bound and form.is_valid():
                self._report(request, decision, decide_bulk(user=request.user, decision=decision,
                                                            comment=form.cleaned_data["comment"],
                                                            expected=form.expected()))
                return None
            plan = plan_bulk(user=request.user, ids=queryset.values_list("pk", flat=True))
            self._report_left_out(request, decision, plan.left_out)
            if not plan.items:
                return None
        except TollgateError as exc:
            if not (form.is_bound and isinstance(exc, InvalidInput) and "comment" in exc.details):
                admin_error(self, request, exc, _("Nothing was %(decision)s: %(error)s"), decision=label(decision))
                return None
            form.add_error("comment", exc.details["comment"])
            plan = plan_bulk(user=request.user, ids=form.expected(), shown=form.expected())
        return TemplateResponse(request, "admin/approvals/interrupt/bulk_confirm.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "title": _("Confirm the decisions"),
            "plan": plan, "form": form, "action": action, "decision": decision,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        })

    def _report_left_out(self, request, decision: str, left_out) -> None:
        """Before the confirmation page: a refusal (an item one may see here but not decide) as an error,
        as ``decide_interrupt`` words it; any other item left out as a warning."""
        for pk, reason in left_out:
            if reason == GONE:
                admin_error(self, request, Forbidden(_("You may not decide this item.")),
                            _("Item %(item)s was not %(decision)s: %(error)s"), item=pk, decision=label(decision))
            else:
                self.message_user(request, _("Item %(item)s was not %(decision)s: %(reason)s.") % {
                    "item": pk, "decision": label(decision), "reason": skip_reason(reason)}, level=messages.WARNING)

    def _report(self, request, decision: str, outcomes) -> None:
        """One message per skipped item (warning) and one for the decided ones (success)."""
        for outcome in outcomes:
            if not outcome.decided:
                self.message_user(request, _("Item %(item)s was not %(decision)s: %(reason)s.") % {
                    "item": outcome.interrupt_id, "decision": label(decision),
                    "reason": skip_reason(outcome.skipped, outcome.detail)}, level=messages.WARNING)
        done = sum(outcome.decided for outcome in outcomes)
        if done:
            done_message = (ngettext("Approved %(count)d item.", "Approved %(count)d items.", done)
                            if decision == Decision.APPROVED
                            else ngettext("Rejected %(count)d item.", "Rejected %(count)d items.", done))
            self.message_user(request, done_message % {"count": done}, level=messages.SUCCESS)


@admin.register(AnswerFile)
class AnswerFileAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Files that answered questions, view-only: name, size, type, uploader and the inbox item.

    Neither the contents nor the storage path are shown: "Download" goes
    to the item page's download (``inbox-item-file``), which serves the
    file only to users who may see its run (``selectors.answer_file_visible``).
    """

    list_display = ("id", "name", "size", "content_type", "uploaded_by", "item", "created_at")
    list_select_related = ("uploaded_by", "interrupt")
    search_fields = ("name", "=interrupt__id", "=interrupt__run__id", "uploaded_by__username")
    date_hierarchy = "created_at"
    fields = ("name", "size", "content_type", "sha256", "uploaded_by", "item", "created_at", "download")

    @admin.display(description=gettext_lazy("inbox item"), ordering="interrupt")
    def item(self, answer_file: AnswerFile):
        return format_html('<a href="{}">{}</a>', reverse("admin:approvals_interrupt_change",
                                                          args=[answer_file.interrupt_id]), answer_file.interrupt)

    @admin.display(description=gettext_lazy("download"))
    def download(self, answer_file: AnswerFile):
        return format_html('<a href="{}" class="answer-file-download">{}</a>',
                           reverse("inbox-item-file", args=[answer_file.interrupt_id]), _("Download"))


def skip_reason(code: str, detail: str = "") -> str:
    """Why ``approvals.bulk`` skipped an item, in the current language (``detail``: a status or an error)."""
    reasons = {
        GONE: _("not found, or not yours to decide"),
        NOT_PENDING: _("it is %(status)s") % {"status": label(detail)} if detail else _("no longer pending"),
        RUN_ENDED: _("its run was cancelled or has ended"),
        CHANGED: _("it changed after the confirmation page was shown"),
    }
    return reasons.get(code) or detail or _("it cannot be decided here")
